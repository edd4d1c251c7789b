"""Stage 2 on the distributed path, candidates: pairs within k, in the
executors (core's ``Pigeonhole``).

Reads the fingerprint pass's rows (``_pos``, ``fp_hi``, ``fp_lo`` and, to
screen, ``summary``). Centres them on the corpus when the job does (the
fingerprint pass's sums of the shares, broadcast: :func:`_centred_words`
decides each fingerprint as the join reads it). Collects the hot keys
(groups above ``max_group`` rows) to the driver. Shuffles each document
k + 1 times keyed by block, packed into a few large values per task, and
joins each task's groups in Rust (:func:`_candidates`): with the spill
folder (:mod:`.spill`) or without a screen, each row holds its document's
position and fingerprint (25 bytes) and the tasks read the summaries
there; else the rows name their documents, each sent with its summary
once per task that holds a row of it. With ``against``, the existing set
is not shuffled: the new batch is broadcast and every partition of the
existing set looks its documents up in it (:func:`_batch_pairs`). When the fingerprint pass
kept the feature sets (:mod:`.spill`), each task of the join checks the
pairs its summaries leave undecided itself, reading the sets of their
documents: no pair crosses another shuffle to be verified. Returns
DataFrames of (``pa``, ``pb``, ``distance``, ``score``): pairs the
summaries (or the join's own exact check) kept, and those left to the
exact check.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from neardup import _neardup as _rs

from .arrow import _packed, _scored_pair_schema, _to_arrow
from .job import ByPartition
from .report import _log
from .tasks import task_count


# Rows of one group of the distributed join held by one task (24 bytes
# each, and its documents'); a larger group is split into block pairs.
MAX_GROUP = 500_000


def _centred_words(b: Any, centre: Any, bits: int) -> bytes:
    """A batch's fingerprints decided from its ``shares`` around ``centre``
    (broadcast), as :func:`_fp_words` gives them."""
    words = np.frombuffer(_rs.centred_words(_packed(b.column("shares")), centre.value), dtype="<u8")
    if bits == 128:
        return words.tobytes()
    return np.column_stack([np.zeros(len(words), dtype="<u8"), words]).tobytes()


def _centre_distributed(fps: Any, centre: Any, bits: int) -> Any:
    """Rows with a ``shares`` column (and zero ``fp_hi``/``fp_lo``) with their
    fingerprints decided around ``centre`` (the broadcast sums of every
    document's shares)."""
    import pyarrow as pa
    from pyspark.sql import types as T

    keep = [f for f in fps.schema.fields if f.name != "shares"]

    def decide(batches):
        for b in batches:
            words = np.frombuffer(_centred_words(b, centre, bits), dtype="<u8").reshape(-1, 2)
            cols = [pa.array(words[:, 0].view(np.int64)) if f.name == "fp_hi" else pa.array(words[:, 1].view(np.int64)) if f.name == "fp_lo"
                    else b.column(f.name) for f in keep]
            yield pa.RecordBatch.from_arrays(cols, names=[f.name for f in keep])

    out = fps.mapInArrow(decide, T.StructType(keep)).localCheckpoint()
    out.count()
    return out


def _fp_words(b: Any) -> bytes:
    """A batch's fingerprints as words, two u64 per row (high, then low)."""
    hi = b.column("fp_hi").to_numpy().view(np.uint64)
    lo = b.column("fp_lo").to_numpy().view(np.uint64)
    return np.column_stack([hi, lo]).astype("<u8").tobytes()


def _routed_documents(routed: bytes) -> Any:
    """The documents of a routed buffer of the join (core's
    ``pigeonhole_route``, with summaries): ``_pos``, ``fp_hi``, ``fp_lo``
    and ``summary`` each, in the buffer's order."""
    row, head, summary = _rs.PIGEONHOLE_RECORD
    n_rows, n_docs = (int(x) for x in np.frombuffer(routed, dtype="<u4", count=2))
    kind = np.dtype([("_pos", "<i8"), ("fp_hi", "<u8"), ("fp_lo", "<u8"), ("summary", "u1", (summary,))])
    assert kind.itemsize == head + summary, "the document layout of core's pigeonhole_route"
    return np.frombuffer(routed, dtype=kind, count=n_docs, offset=8 + n_rows * row)


def _spark_hash(values: Any) -> Any:
    """Spark's ``hash()`` of long values (Murmur3 x86 32-bit of the 8 bytes,
    seed 42: ``Murmur3_x86_32.hashLong``), as int32, computed here."""
    v = np.asarray(values, dtype=np.int64).view(np.uint64)
    with np.errstate(over="ignore"):
        def rotl(x, r):
            return (x << np.uint32(r)) | (x >> np.uint32(32 - r))

        h = np.full(len(v), 42, dtype=np.uint32)
        for word in ((v & np.uint64(0xFFFFFFFF)).astype(np.uint32), (v >> np.uint64(32)).astype(np.uint32)):
            k = rotl(word * np.uint32(0xCC9E2D51), 15) * np.uint32(0x1B873593)
            h = rotl(h ^ k, 13) * np.uint32(5) + np.uint32(0xE6546B64)
        h ^= np.uint32(8)
        h ^= h >> np.uint32(16)
        h *= np.uint32(0x85EBCA6B)
        h ^= h >> np.uint32(13)
        h *= np.uint32(0xC2B2AE35)
        h ^= h >> np.uint32(16)
    return h.view(np.int32)


def _partition_values(parts: int) -> list:
    """A value for each of ``parts`` partitions that Spark's hash
    partitioning (``repartition(parts, column)`` of a long column:
    ``pmod(hash(value), parts)``) sends there: the rows' own destinations
    then decide their tasks. Computed on the driver (:func:`_spark_hash`),
    with no Spark job; the smallest such value of each partition."""
    found = np.full(parts, -1, dtype=np.int64)
    start = 0
    while (found < 0).any():
        values = np.arange(start, start + 64 * parts, dtype=np.int64)
        part = np.mod(_spark_hash(values).astype(np.int64), parts)
        seen, at = np.unique(part, return_index=True)  # each partition's first (smallest) value in this span
        first = np.full(parts, -1, dtype=np.int64)
        first[seen] = values[at]
        found = np.where(found < 0, first, found)
        start += 64 * parts
    return [int(x) for x in found]


def _hot_sample_every(max_group: int) -> int:
    """1 in how many documents the count of the join's groups samples: a
    group at ``max_group`` rows keeps at least 4,096 of them in the
    sample (every document below 4,096 rows, as tests set it), and 1 in 16
    at most."""
    return max(1, min(16, max_group // 4096))


# A spanning join's group of m rows with more than this many undecided
# pairs a row (more than m, at 1) is joined again with its documents'
# feature sets. At 4, a 1 GB corpus with 50,000 near copies of one page
# left 757,204 pairs to the exact check (one of its tasks 8x their median);
# at 1, 151,040.
SPAN_UNDECIDED_PER_ROW = 1


# The feature sets a task of the candidate stage keeps for its groups of near
# copies (each read once, though the copies share up to k + 1 groups).
SPAN_CACHE_BYTES = 256 << 20


# Undecided pairs a task of the candidate stage checks at once, when it
# reads the feature sets the fingerprint pass kept (their documents' sets
# are held together: about 2.7 KB a document in the 4 GB corpus).
EXACT_PAIRS_AT_ONCE = 50_000


# Rows of the candidate stage's shuffle per task (25 bytes each crossing,
# and about 110 bytes a row while the task sorts and joins them, and 168 a
# document: position, fingerprint, summary). With summaries in the rows
# (no spill folder), fewer tasks send each document's summary to fewer of
# them: at 4 GB, 2 million rows a task made the stage 27.0 s against 37.1
# s at 1 million (9 tasks, not 17).
CANDIDATE_ROWS_PER_TASK = 2_000_000


def _candidates(spark: Any, fps: Any, n: int, bits: int, k: int, threshold: Optional[float], max_group: int,
                quiet: bool, spanning: bool = False, features_at: Any = None, centre: Any = None,
                kept_sets: Any = None, kept_summaries: Any = None) -> tuple:
    """Candidate pairs, in the executors (core's ``Pigeonhole``).

    Reads ``fps`` (``_pos``, ``fp_hi``, ``fp_lo`` and, to screen,
    ``summary``; with a ``centre``, the broadcast sums of every document's
    shares, ``shares`` instead of the fingerprint, decided around it as the
    rows are read). Shuffles each document k + 1 times, keyed by (block,
    block value), packed into one value per map batch and task (Spark moves
    a few large values, not a row each; the task of a group is chosen by
    the router, and :func:`_partition_values` makes Spark's partitioning
    agree). With ``kept_summaries`` (positions, ascending, to their
    summaries: those the fingerprint pass kept) or without a ``threshold``,
    lean rows (``pigeonhole_rows``: position, fingerprint and part, 25
    bytes a row) and each task reads its documents' summaries itself; else
    ``pigeonhole_route``'s rows (24 bytes) and each document (position,
    fingerprint, summary: 168 bytes) once per task that holds a row of it.
    A group of more than ``max_group`` rows (counted first: only distinct
    keys move) is split into B = ceil(rows / max_group) salted blocks, each
    row sent to the B block pairs of its block, so that a task holds at
    most about 2 ``max_group`` rows of it. Each group is joined in Rust as ``neardup
    dedup`` joins (the planner's design for its fingerprints); a pair is
    reported by the group of the first block it shares, and screened by
    its summaries. Nothing per document reaches the driver: only the hot
    keys (at most k + 1 per ``max_group`` documents). ``spanning``: only
    enough pairs for the components: copies (one fingerprint, one feature
    set) are joined as one, each linked to it by one pair, and a group
    reports only pairs that join two of its components. A group whose
    undecided pairs outnumber SPAN_UNDECIDED_PER_ROW a row (a crowd of near
    copies the screen cannot decide) is joined again with its documents'
    feature sets (``features_at(positions)``, read at their byte offsets),
    its pairs checked exactly there: a crowd of m near copies then costs
    at most m - 1 pairs, not m²/2. With ``kept_sets`` (positions, ascending,
    to their feature sets: those the fingerprint pass kept), each task
    checks its undecided pairs exactly itself, EXACT_PAIRS_AT_ONCE at a
    time: no pair is shuffled again to be verified.

    Returns (kept, undecided) DataFrames of (``pa``, ``pb``, ``distance``,
    ``score``) with pa < pb (score -1 without verification; NaN in the
    undecided ones, which only the features can decide; with ``kept_sets``,
    none are undecided, and only the pairs at or above the threshold are
    kept), and the counts of pairs within k, of those the exact check
    measured and of those kept (with ``kept_sets``; else None)."""
    import pyarrow as pa
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    blocks = k + 1

    def words_of(b):
        return _fp_words(b) if centre is None else _centred_words(b, centre, bits)

    def keys_of(b):
        return np.frombuffer(_rs.pigeonhole_keys(words_of(b), bits, k), dtype="<i8")

    def only_keys(batches):
        for b in batches:
            yield pa.RecordBatch.from_arrays([pa.array(keys_of(b))], names=["key"])

    key_schema = T.StructType([T.StructField("key", T.LongType(), False)])
    # A group holds at most one row per document: none is hot below max_group.
    # The groups are counted in a sample of the documents (1 in `every`,
    # chosen by position), each count scaled up: a hot group's sampled
    # count is in the thousands, so its estimate is within a few percent.
    every = _hot_sample_every(max_group)
    sample = fps if every == 1 else fps.where(F.pmod(F.xxhash64("_pos"), F.lit(every)) == 0)
    hot_rows = [] if n <= max_group else sorted(
        (r[0], r[1] * every)
        for r in sample.select(*(["shares"] if centre is not None else ["fp_hi", "fp_lo"])).mapInArrow(only_keys, key_schema)
        .groupBy("key").count().where(F.col("count") * every > max_group).collect()
    )
    hot_keys = np.array([key for key, _ in hot_rows], dtype=np.int64)
    hot_split = np.array([-(-c // max_group) for _, c in hot_rows], dtype=np.int64)
    if len(hot_rows):
        _log(quiet, f"candidates: {len(hot_rows):,} groups of more than {max_group:,} rows (up to {max(c for _, c in hot_rows):,}) "
             f"split into up to {hot_split.max():,} blocks each")
    hot = spark.sparkContext.broadcast((hot_keys, hot_split))
    screened = threshold is not None

    # A task's rows cross the shuffle as a few values of packed records (one
    # per map batch and task), not one Spark row each: Spark moves bytes,
    # and each task sorts its records into groups itself.
    cores = spark.sparkContext.defaultParallelism
    parts = task_count(cores, -(-n * blocks // CANDIDATE_ROWS_PER_TASK))
    dest_of = spark.sparkContext.broadcast(_partition_values(parts))

    # Lean rows (each its document's position and fingerprint, no summary:
    # k + 1 rows a document whatever the number of tasks) when the join's
    # tasks need no summaries or read them from the spill folder.
    lean = not screened or kept_summaries is not None

    def keyed(batches):
        hk, hs = (x.astype("<i8").tobytes() for x in hot.value)
        dests = np.asarray(dest_of.value, dtype=np.int64)
        for b in batches:
            if not b.num_rows:
                continue
            pos = b.column("_pos").to_numpy().astype("<i8").tobytes()
            if lean:
                tasks, offsets, data = _rs.pigeonhole_rows(words_of(b), pos, bits, k, hk, hs, parts)
                tasks = np.frombuffer(tasks, dtype="<i4")
                rows = pa.Array.from_buffers(pa.binary(), len(tasks), [None, pa.py_buffer(offsets), pa.py_buffer(data)])
                yield pa.RecordBatch.from_arrays([pa.array(dests[tasks]), rows], names=["dest", "rows"])
                continue
            routed = _rs.pigeonhole_route(words_of(b), pos, bits, k, hk, hs, parts, _packed(b.column("summary")) if screened else None)
            ds = [d for d, r in enumerate(routed) if r]
            yield pa.RecordBatch.from_arrays([pa.array(dests[ds]), pa.array([routed[d] for d in ds], pa.binary())], names=["dest", "rows"])

    pair_schema = _scored_pair_schema()
    checking = kept_sets is not None and screened and not spanning
    counts = spark.sparkContext.accumulator({}, ByPartition()) if checking else None

    exact = spanning and screened and features_at is not None

    def sets_of(routed, cache):
        """One feature set per document of a routed buffer, read once per
        distinct feature set (documents with one summary digest share
        theirs) and kept in ``cache`` for the task's other groups."""
        g = _routed_documents(routed)
        ident = [x.tobytes() for x in g["summary"][:, :20]]  # feature count and digest
        if sum(len(v) for v in cache.values()) > SPAN_CACHE_BYTES:
            cache.clear()  # before this group's sets are looked up: it keeps them all
        missing = {}
        for row, i in enumerate(ident):
            if i not in cache and i not in missing:
                missing[i] = row
        if missing:
            for i, f in zip(missing, features_at(g["_pos"][list(missing.values())])):
                cache[i] = f
        return [cache[i] for i in ident]

    def joined(records, sets=None, cache=None, lean=False):
        kept, scores, und, over = _rs.pigeonhole_pairs(records, bits, k, threshold, spanning,
                                                       cap=SPAN_UNDECIDED_PER_ROW if exact and sets is None else None,
                                                       sets=sets, lean=lean, summaries_of=kept_summaries if lean else None)
        kept = np.frombuffer(kept, dtype="<i8").reshape(-1, 3)
        und = np.frombuffer(und, dtype="<i8").reshape(-1, 3)
        if len(kept) + len(und):
            both = np.concatenate([kept, und])
            score = np.concatenate([np.frombuffer(scores, dtype="<f8"), np.full(len(und), np.nan)])
            yield pa.RecordBatch.from_arrays([pa.array(both[:, 0]), pa.array(both[:, 1]), pa.array(both[:, 2]), pa.array(score)],
                                             names=pair_schema.fieldNames())
        for group in over:
            # A crowd of near copies (a buffer of routed documents with their
            # summaries): its pairs checked exactly, here.
            yield from joined([group], sets_of(group, cache), cache)

    def checked(batches):
        # The undecided pairs measured here, the others passed on; the
        # task's counts of pairs within k, of those measured and of those
        # kept (every pair it yields).
        from pyspark import TaskContext

        found = measured = passed = 0
        for b in batches:
            score = b.column("score").to_numpy()
            und = np.isnan(score)
            found += len(score)
            if not und.any():
                passed += len(score)
                yield b
                continue
            passed += len(score) - int(und.sum())
            yield b.filter(pa.array(~und))
            a, c, d = (b.column(x).to_numpy()[und] for x in ("pa", "pb", "distance"))
            measured += len(a)
            order = np.argsort(a, kind="stable")  # neighbours share documents
            for at in range(0, len(order), EXACT_PAIRS_AT_ONCE):
                sel = order[at : at + EXACT_PAIRS_AT_ONCE]
                need = np.unique(np.concatenate([a[sel], c[sel]]))
                ia = np.searchsorted(need, a[sel]).astype(np.uint32)
                ic = np.searchsorted(need, c[sel]).astype(np.uint32)
                js = np.array(_rs.exact_indexed(kept_sets(need), ia.tobytes(), ic.tobytes(), threshold), dtype=np.float64)
                keep = js >= threshold
                passed += int(keep.sum())
                yield pa.RecordBatch.from_arrays([pa.array(a[sel][keep]), pa.array(c[sel][keep]), pa.array(d[sel][keep]),
                                                  pa.array(js[keep])], names=pair_schema.fieldNames())
        counts.add({TaskContext.get().partitionId(): (found, measured, passed)})

    def pairs_of(batches):
        # This task's records: whole groups (every row of a group has one
        # destination).
        records = [r for b in batches for r in b.column("rows").to_pylist()]
        if records:
            out = joined(records, cache={}, lean=lean)
            yield from checked(out) if checking else out
        elif checking:
            yield from checked([])

    schema = T.StructType([T.StructField("dest", T.LongType(), False), T.StructField("rows", T.BinaryType(), False)])
    shuffled = fps.select(*(["_pos"] + (["shares"] if centre is not None else ["fp_hi", "fp_lo"]) + (["summary"] if screened and not lean else [])))
    shuffled = shuffled.mapInArrow(keyed, schema)
    pairs = shuffled.repartition(parts, "dest").mapInArrow(pairs_of, pair_schema).localCheckpoint()
    dest_of.unpersist()
    hot.unpersist()
    tally = None
    if checking:
        tally = tuple(int(x) for x in np.sum([v for v in counts.value.values()], axis=0)) if counts.value else (0, 0, 0)
    return pairs.where(~F.isnan("score")), pairs.where(F.isnan("score")), tally


# The batch index of the new documents, built once per Python worker and
# kept while the job's stages query it (one at a time).
_BATCH: dict = {}


def _batch_pairs(spark: Any, queries: Any, batch: Any, bits: int, k: int, threshold: Optional[float]) -> tuple:
    """The paper's batch mode: pairs within k of a document of ``queries``
    (the existing set's rows: ``_pos``, ``fp_hi``, ``fp_lo`` and, to screen,
    ``summary``) and one of ``batch`` (rows alike, the new ones). The batch
    is collected and broadcast (about 170 bytes a document: fingerprint,
    position and summary), each Python worker indexes it once (core's
    online index), and every partition of ``queries`` looks its documents
    up: the existing set is read once and never shuffled. Returns (kept,
    undecided) DataFrames of (``pa``, ``pb``, ``distance``, ``score``),
    pa < pb, screened as :func:`_candidates` screens them."""
    import uuid

    import pyarrow as pa
    from pyspark.sql import functions as F

    screened = threshold is not None
    cols = ["_pos", "fp_hi", "fp_lo"] + (["summary"] if screened else [])
    t = _to_arrow(batch.select(*cols))
    if t.num_rows == 0:
        empty = spark.createDataFrame([], _scored_pair_schema())
        return empty, empty
    shipped = spark.sparkContext.broadcast((
        _fp_words(t.combine_chunks().to_batches()[0]),
        _packed(t.column("summary")) if screened else None,
        t.column("_pos").to_numpy(),
    ))
    key = uuid.uuid4().hex  # this batch, in a worker that indexed another
    del t

    def scan(batches):
        if key not in _BATCH:
            _BATCH.clear()  # an earlier stage's batch
            words, sums, pos = shipped.value
            _BATCH[key] = (_rs._BatchIndex(words, bits, k, sums, threshold), pos)
        index, pos = _BATCH[key]
        for b in batches:
            kept, scores, und = index.pairs(_fp_words(b), _packed(b.column("summary")) if screened else None)
            kept = np.frombuffer(kept, dtype="<i8").reshape(-1, 3)
            und = np.frombuffer(und, dtype="<i8").reshape(-1, 3)
            if not len(kept) + len(und):
                continue
            rows = np.concatenate([kept, und])
            mine, theirs = b.column("_pos").to_numpy()[rows[:, 0]], pos[rows[:, 1]]
            score = np.concatenate([np.frombuffer(scores, dtype="<f8"), np.full(len(und), np.nan)])
            yield pa.RecordBatch.from_arrays([pa.array(np.minimum(mine, theirs)), pa.array(np.maximum(mine, theirs)),
                                              pa.array(rows[:, 2]), pa.array(score)], names=["pa", "pb", "distance", "score"])

    pairs = queries.select(*cols).mapInArrow(scan, _scored_pair_schema()).localCheckpoint()
    shipped.unpersist()
    return pairs.where(~F.isnan("score")), pairs.where(F.isnan("score"))
