"""Corpus-scale dedup on Apache Spark, with the same answers as ``neardup dedup``.

Command line (every option of ``neardup dedup``'s pipeline; ``--help``)::

    python -m neardup.spark dedup --input corpus.jsonl --output out/ [--format parquet|jsonl]

From your own PySpark code::

    from neardup.spark import dedup
    result = dedup(spark, df, id_col="id", text_col="text")
    result.pairs, result.clusters, result.deduped      # DataFrames

How it runs (uncompressed JSON Lines files on a file system every executor
sees are read by the executors' Python workers themselves, in byte ranges,
see :class:`LocalSplits`; other inputs by Spark):

1. Fingerprints (one pass over the input, in the executors): whole Arrow
   batches go to Rust (``mapInArrow``), which parses the JSON Lines records,
   and returns each document's fingerprint, id, keep-by key and, with
   verification, a 144-byte summary of its feature set (count, digest,
   124-byte MinHash sketch). Each row's position in input order is computed in
   the same worker from its file and byte offset (:class:`Positions`), so
   every pass finds the same numbers without a pass of its own.
2. Candidates (driver): the fingerprints and summaries, about 175 bytes per
   document, are joined as ``neardup dedup`` joins them, and each candidate
   pair is screened by its summaries: empty sets and unreachable sizes are
   dropped, equal digests kept at 1.0, pairs whose sketches rule the
   threshold out dropped, the same decisions ``neardup dedup`` makes.
3. Exact check (executors): the undecided pairs' documents are read again
   (at their byte offsets, by the task that checks them, when the executors
   read the files), else only those leave the Python workers, each to the bucket of its
   pairs (a connected group of pairs is one bucket; a group of more than
   20,000 documents is spread, a document copied to each bucket of its
   pairs); each bucket's pairs are measured in Rust.
4. Clusters (driver): components or the incremental policy, with keep-by and
   ``against``'s preference, over the verified pairs.
5. Outputs: pairs and clusters from the driver; the kept records in one more
   pass over the input, unchanged (JSON Lines lines or Parquet rows).

Above ``driver_documents`` (20 million) documents the distributed path runs
instead, with nothing per document on the driver (:func:`_distributed_texts`):
the fingerprint pass's rows centred in the executors, candidates by k + 1
keyed groups joined in Rust (core's ``Pigeonhole``: the same pairs as the
CLI's join, a group larger than ``max_group`` split into block pairs),
undecided pairs checked per connected component, components by a union-find
per task then in one task (or large-star/small-star rounds), and the kept
records streamed from each input range minus its removed positions. It
takes the components policy (ids of JSON Lines records read as integers
when every one is, else as strings). With ``against``, the existing set is
read but never shuffled: the new batch is broadcast and indexed in each
worker, and every partition of the existing set looks its documents up in
it (:func:`_batch_pairs`). ``--report FILE``
writes each stage's seconds, rows and bytes shuffled.

Outputs under ``--output DIR``: ``DIR/pairs`` (columns ``a``, ``b``,
``distance``, and ``jaccard`` when verified), ``DIR/clusters``
(``representative``, ``size``, ``members``) and ``DIR/deduped`` (the
surviving input records, unchanged), Parquet by default or JSON Lines; with
``--annotate``, ``DIR/annotated`` (every record with ``cluster``,
``duplicate_of`` and ``similarity`` added, as ``neardup dedup --annotate``).
``--features-field`` takes weighted features instead of texts.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

import neardup
from neardup import _neardup as _rs

# Rows of one group of the distributed join held by one task (about 200
# bytes each with verification); a larger group is split into block pairs.
MAX_GROUP = 500_000


@dataclass
class SparkDedupResult:
    """DataFrames of a Spark dedup, and the wall time of each stage."""

    pairs: Any
    clusters: Any
    deduped: Any
    stages: dict
    #: ``deduped`` holds JSON Lines records (one string column), written as text.
    json_records: bool = False
    #: Writes ``deduped`` as JSON Lines into a local folder from the executors'
    #: own reads of the input (:class:`LocalSplits`), without the JVM.
    write_local: Any = None
    #: With ``annotate``: every record (``neardup dedup --annotate``), with
    #: ``cluster``, ``duplicate_of`` and ``similarity`` added.
    annotated: Any = None
    #: Writes ``annotated`` as ``write_local`` writes ``deduped``.
    write_annotated_local: Any = None
    #: Per-stage figures (seconds, rows, bytes shuffled): see ``--report``.
    report: Any = None


class _Report:
    """Per-stage figures of a run: seconds, rows, the bytes the stage wrote
    to Spark's shuffle and its longest task (from the driver's status store:
    every stage Spark ran since the last one recorded), for the log and
    ``--report``."""

    def __init__(self, spark: Any):
        self.spark = spark
        self.stages: list = []
        self.documents = 0
        self._last = self._shuffle()[0]

    def _shuffle(self) -> tuple:
        """(the newest Spark stage id, bytes written by stages after
        ``_last``, their longest task: a dict of its seconds, the median
        task's seconds of its Spark stage and that stage's task count)."""
        try:
            jvm, sc = self.spark._jvm, self.spark.sparkContext
            store = sc._jsc.sc().statusStore()
            empty = jvm.java.util.ArrayList()
            it = store.stageList(empty, False, False, sc._gateway.new_array(jvm.double, 0), empty).iterator()
            quantiles = sc._gateway.new_array(jvm.double, 2)
            quantiles[0], quantiles[1] = 0.5, 1.0
            newest, written, longest = -1, 0, None
            last = getattr(self, "_last", -1)
            while it.hasNext():
                st = it.next()
                newest = max(newest, st.stageId())
                if st.stageId() <= last:
                    continue
                written += st.shuffleWriteBytes()
                summary = store.taskSummary(st.stageId(), st.attemptId(), quantiles)
                if summary.isDefined():
                    d = summary.get().duration()
                    median, most = d.apply(0) / 1000, d.apply(1) / 1000
                    if longest is None or most > longest["longest_task_seconds"]:
                        longest = {"longest_task_seconds": round(most, 3), "median_task_seconds": round(median, 3),
                                   "tasks": st.numTasks()}
            return newest, written, longest
        except Exception:  # noqa: BLE001 - Spark Connect, or another status store
            return -1, None, None

    def done(self, name: str, seconds: float, documents: int, **rows: int) -> None:
        newest, written, longest = self._shuffle()
        self._last = max(self._last, newest)
        self.stages.append({
            "stage": name,
            "seconds": round(seconds, 3),
            "shuffle_bytes": written,
            "shuffle_bytes_per_document": round(written / documents, 1) if written is not None and documents else None,
            "longest_task": longest,
            **rows,
        })

    def driver_memory(self) -> dict:
        """Peak resident memory of the driver's Python process and, when it
        runs on this machine, of its JVM."""
        import resource

        out = {"python_peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "jvm_peak_bytes": None}
        try:
            pid = self.spark._jvm.java.lang.ProcessHandle.current().pid()
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        out["jvm_peak_bytes"] = int(line.split()[1]) * 1024
        except Exception:  # noqa: BLE001 - another machine or no /proc
            pass
        return out


def _settings(verify: Any, k: Optional[int], config: Any, kwargs: dict, centre: bool = True, idf: Any = None):
    """The configuration, k, the verification threshold, and whether the
    candidates are centred on the corpus, as ``neardup dedup`` picks them."""
    threshold = neardup._verify_threshold(verify)
    cfg, candidates = neardup._dedup_config(threshold is not None, config, dict(kwargs, idf=idf))
    centred = candidates and centre
    if k is None:
        k = _rs.centred_k(cfg.bits) if centred else _rs.default_k(cfg.bits, threshold is not None)
    return cfg, k, threshold, centred


def _centred(shares: bytes, bits: int) -> np.ndarray:
    """Centred fingerprints of all documents' shares, as (n, 2) high and low
    words (128 bits) or n words (64)."""
    words = np.frombuffer(_rs.centred_words(shares, _rs.centre_of(shares, bits)), dtype="<u8")
    return words.reshape(-1, 2) if bits == 128 else words


def _fixed_rows(data: bytes, rows: int) -> Any:
    """``rows`` rows of equal width packed in ``data``, as an Arrow binary column."""
    import pyarrow as pa

    width = len(data) // max(rows, 1)
    offsets = np.arange(rows + 1, dtype=np.int32) * width
    return pa.Array.from_buffers(pa.binary(), rows, [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data)])


def _packed(column: Any) -> bytes:
    """An Arrow binary column's values, one after another."""
    arr = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    offs = np.frombuffer(arr.buffers()[1], dtype=np.int32)[arr.offset : arr.offset + len(arr) + 1]
    return arr.buffers()[2].to_pybytes()[offs[0] : offs[-1]] if len(arr) else b""


def _centre_distributed(spark: Any, fps: Any, bits: int) -> Any:
    """Rows with a ``shares`` column (and zero ``fp_hi``/``fp_lo``) with their
    fingerprints centred on all rows' shares: summed per partition, added on
    the driver, and sent back to decide each row's bits."""
    import pyarrow as pa
    from pyspark.sql import types as T

    def sums(batches):
        for b in batches:
            yield pa.RecordBatch.from_arrays([pa.array([_rs.centre_of(_packed(b.column("shares")), bits)], type=pa.binary())], names=["centre"])

    parts = fps.select("shares").mapInArrow(sums, T.StructType([T.StructField("centre", T.BinaryType(), False)])).collect()
    total = np.zeros(bits + 1, dtype=np.uint64)
    for row in parts:
        total += np.frombuffer(row[0], dtype="<u8")
    centre = spark.sparkContext.broadcast(total.astype("<u8").tobytes())
    keep = [f for f in fps.schema.fields if f.name != "shares"]

    def decide(batches):
        for b in batches:
            words = np.frombuffer(_rs.centred_words(_packed(b.column("shares")), centre.value), dtype="<u8")
            hi, lo = (words.reshape(-1, 2)[:, 0], words.reshape(-1, 2)[:, 1]) if bits == 128 else (np.zeros(len(words), dtype=np.uint64), words)
            cols = [pa.array(hi.view(np.int64)) if f.name == "fp_hi" else pa.array(lo.view(np.int64)) if f.name == "fp_lo" else b.column(f.name) for f in keep]
            yield pa.RecordBatch.from_arrays(cols, names=[f.name for f in keep])

    out = fps.mapInArrow(decide, T.StructType(keep)).localCheckpoint()
    out.count()
    return out


def _named_outputs(pairs: Any, reps: Any, ids: Any, scores: list) -> tuple:
    """The distributed paths' outputs named by ids (``ids``: ``_pos``,
    ``_id``): the pairs (``pa``, ``pb``, ``distance`` and the columns
    ``scores``) as ``a``, ``b``, ``distance``, ... in input order, or None
    without pairs; and the clusters of ``reps`` (``_pos``, ``rep``) as
    ``representative``, ``size`` and ``members`` (in input order)."""
    from pyspark.sql import functions as F

    # Every clustered document named once (a cluster's representative and
    # each pair's two documents are among them), kept for both outputs.
    members = reps.join(ids, "_pos").localCheckpoint(eager=False)
    out_pairs = None
    if pairs is not None:
        out_pairs = (
            pairs.join(members.select(F.col("_pos").alias("pa"), F.col("_id").alias("a")), "pa")
            .join(members.select(F.col("_pos").alias("pb"), F.col("_id").alias("b")), "pb")
            .orderBy("pa", "pb")
            .select("a", "b", "distance", *scores)
        )
    clusters = (
        members.groupBy("rep")
        .agg(F.count("*").alias("size"), F.sort_array(F.collect_list(F.struct("_pos", "_id"))).alias("m"),
             F.first(F.when(F.col("_pos") == F.col("rep"), F.col("_id")), ignorenulls=True).alias("representative"))
        .orderBy("rep")
        .select("representative", "size", F.col("m._id").alias("members"))
    )
    return out_pairs, clusters


def _dedup_vectors(
    spark: Any,
    df: Any,
    *,
    id_col: str,
    vector_col: str,
    k: Optional[int] = None,
    verify: Any = True,
    max_group: int = MAX_GROUP,
    min_similarity: Optional[float] = None,
    **kwargs: Any,
) -> SparkDedupResult:
    """Dense vectors, as ``neardup dedup`` takes them: 128 bits, k for 99%
    recall at the cosine threshold, candidates by :func:`_candidates`,
    confirmed by exact cosine. Components policy, keep-by first."""
    import pyarrow as pa
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    cos = neardup.DEFAULT_COSINE if min_similarity is None else float(min_similarity)
    cfg = neardup.vector_config(int(kwargs.pop("bits", 128)), None, int(kwargs.pop("seed", 0)))
    if kwargs:
        raise TypeError(f"vectors take bits= and seed=, not {sorted(kwargs)}")
    threshold = cos if (verify is not False and verify is not None) else None
    if k is None:
        k = _rs.default_vector_k(cfg.bits, cos, threshold is not None)
    score = "cosine"
    bits = cfg.bits
    cfg_json = cfg.to_json()
    stages = {}
    t0 = time.monotonic()

    if "_pos" in df.columns:
        with_pos = df  # numbered by the caller in input order
    else:
        # Input order: positions 0..n-1 in the order Spark reads.
        indexed = df.rdd.zipWithIndex().map(lambda rv: (rv[1],) + tuple(rv[0]))
        with_pos = spark.createDataFrame(indexed, T.StructType([T.StructField("_pos", T.LongType(), False)] + df.schema.fields))
    with_pos = with_pos.localCheckpoint()
    n = with_pos.count()
    fp_schema = T.StructType(
        [
            T.StructField("_pos", T.LongType(), False),
            T.StructField("fp_hi", T.LongType(), False),
            T.StructField("fp_lo", T.LongType(), False),
        ]
        + ([T.StructField("shingles", T.BinaryType(), False)] if threshold is not None else [])
    )

    def fingerprint_batches(batches):
        c = neardup.FingerprintConfig.from_json(cfg_json)
        for b in batches:
            vectors = b.column(vector_col)
            fps = neardup.fingerprint_vectors(vectors, config=c)
            if bits == 128:
                hi, lo = fps[:, 0], fps[:, 1]
            else:
                hi, lo = np.zeros(len(fps), dtype=np.uint64), fps
            cols = [b.column("_pos"), pa.array(hi.view(np.int64)), pa.array(lo.view(np.int64))]
            if threshold is not None:
                rows = [blk.astype(np.float32) for blk, _ in neardup._vector_rows(vectors)]
                cols.append(pa.array([r.tobytes() for blk in rows for r in blk], type=pa.binary()))
            yield pa.RecordBatch.from_arrays(cols, schema=pa.schema([(f.name, _arrow_type(f.dataType)) for f in fp_schema.fields]))

    fps = with_pos.select("_pos", vector_col).mapInArrow(fingerprint_batches, fp_schema).localCheckpoint()
    fps.count()
    stages["fingerprint"] = time.monotonic() - t0

    t1 = time.monotonic()
    pairs, _ = _candidates(spark, fps.select("_pos", "fp_hi", "fp_lo"), n, bits, k, None, max_group, True)
    pairs = pairs.select("pa", "pb", "distance")
    pair_schema = T.StructType([T.StructField(c, T.LongType(), False) for c in ("pa", "pb", "distance")])
    stages["candidates"] = time.monotonic() - t1

    t2 = time.monotonic()
    if threshold is not None:
        sets = fps.select("_pos", "shingles")
        joined = (
            pairs.join(sets.withColumnRenamed("_pos", "pa").withColumnRenamed("shingles", "sa"), "pa")
            .join(sets.withColumnRenamed("_pos", "pb").withColumnRenamed("shingles", "sb"), "pb")
        )
        j_schema = T.StructType(pair_schema.fields + [T.StructField(score, T.DoubleType(), False)])
        measure = _rs.cosine_pairs

        def jaccard_batches(batches):
            for b in batches:
                js = measure(b.column("sa").to_pylist(), b.column("sb").to_pylist())
                yield pa.RecordBatch.from_arrays(
                    [b.column("pa"), b.column("pb"), b.column("distance"), pa.array(js, type=pa.float64())],
                    names=["pa", "pb", "distance", score],
                )

        pairs = joined.select("pa", "pb", "distance", "sa", "sb").mapInArrow(jaccard_batches, j_schema)
        pairs = pairs.where(F.col(score) >= F.lit(threshold)).localCheckpoint()
        pairs.count()
    stages["verify"] = time.monotonic() - t2

    t3 = time.monotonic()
    reps = _components(spark, pairs.select(F.col("pa").alias("a"), F.col("pb").alias("b")))
    stages["components"] = time.monotonic() - t3

    t4 = time.monotonic()
    ids = with_pos.select("_pos", F.col(id_col).alias("_id"))
    out_pairs, clusters = _named_outputs(pairs, reps, ids, [score] if threshold is not None else [])
    dropped = reps.where(F.col("_pos") != F.col("rep")).select("_pos")
    deduped = with_pos.join(dropped, "_pos", "left_anti").orderBy("_pos").drop("_pos")
    stages["outputs"] = time.monotonic() - t4
    return SparkDedupResult(out_pairs, clusters, deduped, stages)


def _whole_groups(batches: Any, cols: tuple) -> Any:
    """Tables of whole groups from batches sorted by ``cols``: a group that
    runs across batches is held until its last row has come."""
    import pyarrow as pa

    pending: list = []
    for b in batches:
        if not b.num_rows:
            continue
        change = np.zeros(b.num_rows, dtype=bool)
        for c in cols:
            v = b.column(c).to_numpy()
            change[1:] |= v[1:] != v[:-1]
        change[0] = not pending or any(pending[-1].column(c)[-1].as_py() != b.column(c)[0].as_py() for c in cols)
        starts = np.flatnonzero(change)
        if not len(starts):
            pending.append(b)
            continue
        last = int(starts[-1])
        done = pending + ([b.slice(0, last)] if last else [])
        if done:
            yield pa.Table.from_batches(done)
        pending = [b.slice(last)]
    if pending:
        yield pa.Table.from_batches(pending)


def _fp_words(b: Any) -> bytes:
    """A batch's fingerprints as words, two u64 per row (high, then low)."""
    hi = b.column("fp_hi").to_numpy().view(np.uint64)
    lo = b.column("fp_lo").to_numpy().view(np.uint64)
    return np.column_stack([hi, lo]).astype("<u8").tobytes()


# Documents per partition of the distributed path's joins (ids, clusters),
# when the session does not set spark.sql.shuffle.partitions.
DOCUMENTS_PER_PARTITION = 200_000

# A spanning join's group of m rows with more than this many undecided
# pairs a row (more than m, at 1) is joined again with its documents'
# feature sets. At 4, a 1 GB corpus with 50,000 near copies of one page
# left 757,204 pairs to the exact check (one of its tasks 8x their median);
# at 1, 151,040.
SPAN_UNDECIDED_PER_ROW = 1

# The feature sets a task of the candidate stage keeps for its groups of near
# copies (each read once, though the copies share up to k + 1 groups).
SPAN_CACHE_BYTES = 256 << 20

# Rows of the candidate stage's shuffle per partition (about 200 bytes each
# with a verification summary, sorted by Spark, which spills beyond memory).
CANDIDATE_ROWS_PER_TASK = 1_000_000


def _candidates(spark: Any, fps: Any, n: int, bits: int, k: int, threshold: Optional[float], max_group: int,
                quiet: bool, spanning: bool = False, features_at: Any = None) -> tuple:
    """Candidate pairs, in the executors (core's ``Pigeonhole``).

    Reads ``fps`` (``_pos``, ``fp_hi``, ``fp_lo`` and, to screen, ``summary``).
    Shuffles each document k + 1 times, keyed by (block, block value): 40
    bytes a row, plus the 144-byte summary when verifying. A group of more
    than ``max_group`` rows (counted first: only distinct keys move) is split
    into B = ceil(rows / max_group) salted blocks, each row sent to the B
    block pairs of its block, so that a task holds at most about
    2 ``max_group`` rows of it. Each group is joined in Rust as ``neardup
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
    at most m - 1 pairs, not m²/2.

    Returns (kept, undecided) DataFrames of (``pa``, ``pb``, ``distance``,
    ``score``) with pa < pb (score -1 without verification; NaN in the
    undecided ones, which only the features can decide)."""
    import pyarrow as pa
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    blocks = k + 1

    def keys_of(b):
        return np.frombuffer(_rs.pigeonhole_keys(_fp_words(b), bits, k), dtype="<i8")

    def only_keys(batches):
        for b in batches:
            yield pa.RecordBatch.from_arrays([pa.array(keys_of(b))], names=["key"])

    key_schema = T.StructType([T.StructField("key", T.LongType(), False)])
    # A group holds at most one row per document: none is hot below max_group.
    hot_rows = [] if n <= max_group else sorted(
        (r[0], r[1])
        for r in fps.select("fp_hi", "fp_lo").mapInArrow(only_keys, key_schema).groupBy("key").count()
        .where(F.col("count") > max_group).collect()
    )
    hot_keys = np.array([key for key, _ in hot_rows], dtype=np.int64)
    hot_split = np.array([-(-c // max_group) for _, c in hot_rows], dtype=np.int64)
    if len(hot_rows):
        _log(quiet, f"candidates: {len(hot_rows):,} groups of more than {max_group:,} rows (up to {max(c for _, c in hot_rows):,}) "
             f"split into up to {hot_split.max():,} blocks each")
    hot = spark.sparkContext.broadcast((hot_keys, hot_split))
    screened = threshold is not None
    fields = [T.StructField(c, T.LongType(), False) for c in ("key", "bi", "bj", "salt", "_pos", "fp_hi", "fp_lo")]
    if screened:
        fields.append(T.StructField("summary", T.BinaryType(), False))
    row_schema = T.StructType(fields)

    def keyed(batches):
        hk, hs = hot.value
        for b in batches:
            m = b.num_rows
            keys = keys_of(b)
            row = np.repeat(np.arange(m), blocks)
            split = np.ones(len(keys), dtype=np.int64)
            if len(hk):
                at = np.minimum(np.searchsorted(hk, keys), len(hk) - 1)
                is_hot = hk[at] == keys
                split[is_hot] = hs[at[is_hot]]
            pos = b.column("_pos").to_numpy()
            mixed = (pos[row].astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(33)
            salt = (mixed % split.astype(np.uint64)).astype(np.int64)
            # A row of a split group goes to the block pair (min, max) of its
            # block and each block of the group.
            rep = np.repeat(np.arange(len(keys)), split)
            other = np.arange(len(rep)) - np.repeat(np.cumsum(split) - split, split)
            s = salt[rep]
            take = row[rep]
            cols = [
                pa.array(keys[rep]),
                pa.array(np.minimum(s, other)),
                pa.array(np.maximum(s, other)),
                pa.array(s),
                pa.array(pos[take]),
                pa.array(b.column("fp_hi").to_numpy()[take]),
                pa.array(b.column("fp_lo").to_numpy()[take]),
            ]
            if screened:
                cols.append(b.column("summary").take(pa.array(take)))
            yield pa.RecordBatch.from_arrays(cols, names=row_schema.fieldNames())

    pair_schema = _scored_pair_schema()

    exact = spanning and screened and features_at is not None

    def sets_of(g, cache):
        """One feature set per row of group ``g``, read once per distinct
        feature set (rows with one summary digest share theirs) and kept in
        ``cache`` for the task's other groups."""
        packed = np.frombuffer(_packed(g.column("summary")), dtype=np.uint8).reshape(g.num_rows, -1)
        ident = [x.tobytes() for x in packed[:, :20]]  # feature count and digest
        missing = {}
        for row, i in enumerate(ident):
            if i not in cache and i not in missing:
                missing[i] = row
        if missing:
            if sum(len(v) for v in cache.values()) > SPAN_CACHE_BYTES:
                cache.clear()
            pos = g.column("_pos").to_numpy()
            for i, f in zip(missing, features_at(pos[list(missing.values())])):
                cache[i] = f
        return [cache[i] for i in ident]

    def joined(t, sets=None, cache=None):
        col = lambda c: t.column(c).to_numpy().astype("<i8").tobytes()  # noqa: E731
        words = np.column_stack([t.column(c).to_numpy().view(np.uint64) for c in ("fp_hi", "fp_lo")]).astype("<u8").tobytes()
        kept, scores, und, over = _rs.pigeonhole_pairs(
            col("key"), col("bi"), col("bj"), col("salt"), col("_pos"), words, bits, k,
            _packed(t.column("summary")) if screened else None, threshold, spanning,
            cap=SPAN_UNDECIDED_PER_ROW if exact and sets is None else None, sets=sets)
        kept = np.frombuffer(kept, dtype="<i8").reshape(-1, 3)
        und = np.frombuffer(und, dtype="<i8").reshape(-1, 3)
        if len(kept) + len(und):
            both = np.concatenate([kept, und])
            score = np.concatenate([np.frombuffer(scores, dtype="<f8"), np.full(len(und), np.nan)])
            yield pa.RecordBatch.from_arrays([pa.array(both[:, 0]), pa.array(both[:, 1]), pa.array(both[:, 2]), pa.array(score)],
                                             names=pair_schema.fieldNames())
        for start, end in np.frombuffer(over, dtype="<i8").reshape(-1, 2):
            # A crowd of near copies: its pairs checked exactly, here.
            g = t.slice(int(start), int(end - start))
            yield from joined(g, sets_of(g, cache))

    def pairs_of(batches):
        cache: dict = {}
        for t in _whole_groups(batches, ("key", "bi", "bj")):
            yield from joined(t, cache=cache)

    cores = spark.sparkContext.defaultParallelism
    parts = max(2 * cores, -(-n * blocks // CANDIDATE_ROWS_PER_TASK))
    group = ["key", "bi", "bj"]
    rows = fps.select(*row_schema.fieldNames()[4:]).mapInArrow(keyed, row_schema)
    pairs = rows.repartition(parts, *group).sortWithinPartitions(*group).mapInArrow(pairs_of, pair_schema).localCheckpoint()
    hot.unpersist()
    return pairs.where(~F.isnan("score")), pairs.where(F.isnan("score"))


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


def _scored_pair_schema() -> Any:
    """The distributed path's pairs: (``pa``, ``pb``, ``distance``, ``score``)."""
    from pyspark.sql import types as T

    return T.StructType([
        T.StructField("pa", T.LongType(), False),
        T.StructField("pb", T.LongType(), False),
        T.StructField("distance", T.LongType(), False),
        T.StructField("score", T.DoubleType(), False),
    ])


def _old_links(spark: Any, edges: Any, old_fps: Any, first_new: int, *, bits: int, k: int, threshold: Optional[float],
               quiet: bool, verify: Any) -> Any:
    """``edges`` (verified pairs with a new document) plus the verified
    pairs of two old documents in the components of new ones: ``neardup
    dedup --against`` joins every document, so two old documents near each
    other join one cluster when a new one reaches either. Round by round,
    the old documents reached last (first those paired with a new one) are
    looked up against the whole existing set (:func:`_batch_pairs`, which
    reads it without shuffling it) and their pairs verified (``verify(und,
    count)``), until a round reaches no old document not seen before; the
    existing set being clean, one round is the rule."""
    from pyspark.sql import functions as F

    def ends(pairs):
        return pairs.select(F.col("pa").alias("_pos")).union(pairs.select(F.col("pb").alias("_pos")))

    seen = ends(edges).where(F.col("_pos") < first_new).distinct().localCheckpoint()
    frontier, rounds = seen, 0
    while frontier.count():
        rounds += 1
        found_kept, found_und = _batch_pairs(spark, old_fps, old_fps.join(frontier, "_pos", "left_semi"), bits, k, threshold)
        # A pair of two documents both reached is found from either side.
        found_kept = found_kept.where(F.col("pa") != F.col("pb")).distinct()
        found_und = found_und.where(F.col("pa") != F.col("pb")).distinct()
        n_und = found_und.count()
        found = found_kept.unionByName(verify(found_und, n_und)) if n_und else found_kept
        found = found.localCheckpoint()
        edges = edges.unionByName(found)
        frontier = ends(found).distinct().join(seen, "_pos", "left_anti").localCheckpoint()
        seen = seen.unionByName(frontier).localCheckpoint()
    _log(quiet, f"against: {seen.count():,} old documents in clusters with new ones "
         f"({rounds} round{'' if rounds == 1 else 's'} of lookups)")
    return edges.localCheckpoint()


# Undecided pairs checked by one task of the distributed exact check (their
# documents' texts and feature sets are held at once), and the most
# documents of one connected group of them sent to one task whole.
EXACT_PAIRS_PER_TASK = 20_000
EXACT_DOCS_PER_TASK = 20_000


def _features_of(rows_of: Any, batch: Any, need: Any) -> list:
    """The feature sets (sorted u64 hashes as bytes) of the records of
    ``batch``, at positions ``need``."""
    r, rows = rows_of(batch, need, False, True, fingerprints=False)
    if len(rows) != len(need):
        raise neardup.NeardupError("the input changed while the job ran: a document to check is no longer where it was read")
    return r["features"]


def _features_at(spark: Any, splits: Any, rows_of: Any) -> Any:
    """A function of positions to their documents' feature sets, one each,
    read in the executors at their byte offsets (one read per document)."""
    paths = spark.sparkContext.broadcast(splits.paths())

    def at(positions):
        need, back = np.unique(positions, return_inverse=True)
        sets = _features_of(rows_of, read_lines_at(paths.value, need), need)
        return [sets[i] for i in back]

    return at


def _verify_distributed(spark: Any, undecided: Any, count: int, threshold: float, rows_of: Any, splits: Any,
                        texts: Any) -> Any:
    """The exact check of the undecided pairs, in the executors.

    Reads the undecided (``pa``, ``pb``, ``distance``) pairs, sent by
    connected component (:func:`_components`) to tasks of about
    EXACT_PAIRS_PER_TASK pairs. When the executors
    read the input themselves (``splits``), each task reads its pairs'
    documents at their byte offsets: no text is shuffled. Otherwise each
    document is shuffled once to each task holding one of its pairs
    (``texts(fn, schema)`` maps the input's batches). Returns the pairs at
    or above the threshold, with their exact ``score``."""
    import pyarrow as pa
    from pyspark.sql import functions as F

    cores = spark.sparkContext.defaultParallelism
    parts = max(cores, -(-count // EXACT_PAIRS_PER_TASK))
    # Pairs of one connected component go to one task, so that each
    # document is read once; a component of more than EXACT_DOCS_PER_TASK
    # documents is spread by its pairs' first documents.
    comp = _components(spark, undecided.select(F.col("pa").alias("a"), F.col("pb").alias("b")), count=count)
    large = comp.groupBy("rep").count().where(F.col("count") > EXACT_DOCS_PER_TASK).select("rep", F.lit(True).alias("large"))
    undecided = (
        undecided.join(comp.withColumnRenamed("_pos", "pa"), "pa")
        .join(F.broadcast(large), "rep", "left")
        .withColumn("bucket", F.when(F.col("large"), F.col("pa")).otherwise(F.col("rep")))
    )
    out_schema = _scored_pair_schema()
    t = threshold

    def measured(a, b, d, need, sets):
        ia = np.searchsorted(need, a).astype(np.uint32)
        ib = np.searchsorted(need, b).astype(np.uint32)
        js = np.array(_rs.exact_indexed(sets, ia.tobytes(), ib.tobytes(), t), dtype=np.float64)
        keep = js >= t
        return pa.RecordBatch.from_arrays([pa.array(a[keep]), pa.array(b[keep]), pa.array(d[keep]), pa.array(js[keep])],
                                          names=out_schema.fieldNames())

    if splits is not None:
        paths = spark.sparkContext.broadcast(splits.paths())

        def check(batches):
            got = [b for b in batches if b.num_rows]
            if not got:
                return
            tb = pa.Table.from_batches(got)
            a, b, d = (tb.column(c).to_numpy() for c in ("pa", "pb", "distance"))
            need = np.unique(np.concatenate([a, b]))
            yield measured(a, b, d, need, _features_of(rows_of, read_lines_at(paths.value, need), need))

        return undecided.select("pa", "pb", "distance", "bucket").repartition(parts, "bucket").mapInArrow(check, out_schema)

    body_field = texts.columns[1]
    und = undecided.select("pa", "pb", "distance", F.pmod(F.xxhash64("bucket"), F.lit(parts)).alias("part"))
    routes = und.select(F.col("pa").alias("_pos"), "part").union(und.select(F.col("pb").alias("_pos"), "part")).distinct()
    docs = texts.join(routes, "_pos")
    both = und.select("part", "pa", "pb", "distance", F.lit(None).cast("long").alias("_pos"),
                      F.lit(None).cast(texts.schema[body_field].dataType).alias(body_field))
    both = both.unionByName(docs.select("part", F.lit(None).cast("long").alias("pa"), F.lit(None).cast("long").alias("pb"),
                                        F.lit(None).cast("long").alias("distance"), "_pos", body_field))

    def check_routed(batches):
        import pyarrow.compute as pc

        got = [b for b in batches if b.num_rows]
        if not got:
            return
        tb = pa.Table.from_batches(got)
        is_pair = pc.is_valid(tb.column("pa"))
        pairs_t, docs_t = tb.filter(is_pair), tb.filter(pc.invert(is_pair))
        if not pairs_t.num_rows:
            return
        p = docs_t.column("_pos").to_numpy()
        need, first = np.unique(p, return_index=True)
        one = docs_t.take(pa.array(first)).combine_chunks().to_batches()[0]
        a, b, d = (pairs_t.column(c).to_numpy() for c in ("pa", "pb", "distance"))
        yield measured(a, b, d, need, _features_of(rows_of, one, need))

    return both.repartition(parts, "part").mapInArrow(check_routed, out_schema)


def _distributed_texts(spark: Any, fps: Any, n: int, *, bits: int, k: int, threshold: Optional[float], centred: bool,
                       max_group: int, pairs: bool, quiet: bool, stages: dict, rows_of: Any, splits: Any, texts: Any,
                       numbered: Any, json_col: Optional[str], bad: Any = None,
                       report: Any = None, keep_by: Optional[str] = None,
                       first_new: Optional[int] = None, n_new: int = 0) -> SparkDedupResult:
    """The distributed path for texts: every stage in the executors, the
    driver holding only what does not grow with the corpus (the centre, the
    hot keys, counts). Reads the fingerprint pass's rows ``fps`` (``_pos``,
    ``_id``, ``fp_hi``/``fp_lo`` or ``shares``, ``summary``); candidates by
    :func:`_candidates`, the undecided ones checked by
    :func:`_verify_distributed`, components by large-star/small-star, and
    the kept records streamed from the input minus the removed positions.

    ``first_new``: with documents already clean (``--against``), the first
    position of a new one (the old ones come first); ``n_new`` new ones. The new ones are joined
    among themselves by :func:`_candidates` and with the old ones by
    :func:`_batch_pairs` (the existing set read, never shuffled); pairs of
    two old documents are sought only from the old documents the new ones
    reach (:func:`_old_links`), for the clusters, as ``neardup dedup
    --against`` clusters them."""
    import pyarrow as pa
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    cores = spark.sparkContext.defaultParallelism
    if not spark.sparkContext.getConf().contains("spark.sql.shuffle.partitions"):
        # The joins' shuffles (Spark's default of 200 partitions is too many
        # on a few cores, too few at billions of documents), unless set.
        spark.conf.set("spark.sql.shuffle.partitions", str(max(4 * cores, -(-n // DOCUMENTS_PER_PARTITION))))
    t1 = time.monotonic()
    if centred:
        fps = _centre_distributed(spark, fps, bits)
    # A crowd of near copies in one group is checked there (texts read at
    # their byte offsets, when the executors read the input).
    features_at = _features_at(spark, splits, rows_of) if splits is not None and not pairs else None
    if first_new is None:
        kept, undecided = _candidates(spark, fps, n, bits, k, threshold, max_group, quiet, spanning=not pairs,
                                      features_at=features_at)
    else:
        new_fps, old_fps = fps.where(F.col("_pos") >= first_new), fps.where(F.col("_pos") < first_new)
        kept, undecided = _candidates(spark, new_fps, n_new, bits, k, threshold, max_group, quiet, spanning=not pairs,
                                      features_at=features_at)
        tb = time.monotonic()
        batch_kept, batch_und = _batch_pairs(spark, old_fps, new_fps, bits, k, threshold)
        _log(quiet, f"against: {n - n_new:,} old documents looked up in the {n_new:,} new ones: "
             f"{batch_kept.count() + batch_und.count():,} pairs within k = {k} in {time.monotonic() - tb:.1f} s")
        kept, undecided = kept.unionByName(batch_kept), undecided.unionByName(batch_und)
    n_kept, n_und = kept.count(), undecided.count()
    stages["candidates"] = time.monotonic() - t1
    report.done("candidates", stages["candidates"], n, pairs=n_kept + n_und, undecided=n_und)
    _log(quiet, f"candidates: {n_kept + n_und:,} pairs within k = {k}"
         f"{f', {n_und:,} left to the exact check' if threshold is not None else ''} in {stages['candidates']:.1f} s")
    t2 = time.monotonic()
    edges = kept
    if n_und:
        verified = _verify_distributed(spark, undecided, n_und, threshold, rows_of, splits, texts)
        edges = kept.unionByName(verified).localCheckpoint()
    if first_new is not None:
        edges = _old_links(spark, edges, old_fps, first_new, bits=bits, k=k, threshold=threshold, quiet=quiet,
                           verify=lambda und, count: _verify_distributed(spark, und, count, threshold, rows_of, splits, texts))
    stages["verify"] = time.monotonic() - t2
    n_edges = edges.count()
    report.done("verify", stages["verify"], n, verified=n_edges)
    if threshold is not None:
        _log(quiet, f"verify: {n_edges:,} pairs at Jaccard >= {threshold} in {stages['verify']:.1f} s")

    t3 = time.monotonic()
    reps = _components(spark, edges.select(F.col("pa").alias("a"), F.col("pb").alias("b")), count=n_edges)
    if keep_by is not None:
        reps = _keepers(reps, fps, keep_by, first_new)
    removed = F.col("_pos") != F.col("rep")
    if first_new is not None:
        # Old documents are never removed; only clusters with a new member
        # are reported, and only pairs with a new document.
        removed &= F.col("_pos") >= first_new
        reps = reps.join(reps.where(F.col("_pos") >= first_new).select("rep").distinct(), "rep", "left_semi")
        edges = edges.where(F.col("pb") >= first_new)
    dropped = reps.where(removed).select("_pos").localCheckpoint()
    n_dropped = dropped.count()
    if bad is not None:
        dropped = dropped.union(bad)  # skipped records are not kept either
    stages["components"] = time.monotonic() - t3
    report.done("components", stages["components"], n, removed=n_dropped)
    _log(quiet, f"components: {n_dropped:,} documents removed in {stages['components']:.1f} s")
    for st in report.stages:
        if st["shuffle_bytes"] is not None:
            task = st["longest_task"]
            tail = (f", longest task {task['longest_task_seconds']:.1f} s (its Spark stage's median "
                    f"{task['median_task_seconds']:.1f} s of {task['tasks']:,} tasks)") if task else ""
            _log(quiet, f"{st['stage']}: {st['shuffle_bytes'] / 1e6:,.1f} MB shuffled "
                 f"({st['shuffle_bytes_per_document']:,.0f} bytes a document){tail}")

    ids = fps.select("_pos", "_id")
    if json_col is not None:
        # Ids as the records hold them: integers if every one is, else strings.
        ints = ids.where(F.col("_id").startswith('"')).limit(1).count() == 0
        wrapped = F.concat(F.lit('{"v":'), F.col("_id"), F.lit("}"))
        ids = ids.select("_pos", F.from_json(wrapped, "v long" if ints else "v string").getField("v").alias("_id"))
    out_pairs, clusters = _named_outputs(edges if pairs else None, reps, ids,
                                         [F.col("score").alias("jaccard")] if threshold is not None else [])
    blank = "^[ \\t\\n\\r\\f]*$"  # blank lines are not records (as `neardup dedup` reads them)
    result = SparkDedupResult(out_pairs, clusters, None, stages, json_col is not None, report=report)
    if splits is not None:
        # Each byte range read by one task, minus its removed positions
        # (grouped by range: no list of them on the driver).
        starts = spark.sparkContext.broadcast(np.array([(rank << _POS_SHIFT) | start for _, rank, start, _, _ in splits.ranges],
                                                       dtype=np.int64))
        index_schema = T.StructType([T.StructField("index", T.LongType(), False), T.StructField("_pos", T.LongType(), False)])

        def indexed(batches):
            for b in batches:
                p = b.column("_pos").to_numpy()
                at = np.searchsorted(starts.value, p, side="right") - 1
                yield pa.RecordBatch.from_arrays([pa.array(at.astype(np.int64)), pa.array(p)], names=["index", "_pos"])

        gone = dropped.mapInArrow(indexed, index_schema).groupBy("index").agg(F.collect_list("_pos").alias("gone"))
        ranges = splits.frame(spark).where(F.col("new")).join(gone, "index", "left").orderBy("index")

        def kept_of(b, gone_list):
            import pyarrow.compute as pc

            keep = b.column("_new").to_numpy(zero_copy_only=False).copy()
            if gone_list:
                keep &= ~np.isin(b.column("_pos").to_numpy(), np.asarray(gone_list, dtype=np.int64))
            keep &= ~pc.match_substring_regex(b.column("value"), blank).to_numpy(zero_copy_only=False)
            return b.column("value").filter(pa.array(keep)) if keep.any() else None

        def kept_lines(batches):
            for b in batches:
                for path, rank, start, end, new, gone_list in zip(*(b.column(c).to_pylist() for c in ("path", "rank", "start", "end", "new", "gone"))):
                    for lines_batch in _read_range(path, rank, start, end, new, False, 16 << 20):
                        lines = kept_of(lines_batch, gone_list)
                        if lines is not None:
                            yield pa.RecordBatch.from_arrays([_without_newlines(lines)], names=["value"])

        result.deduped = ranges.mapInArrow(kept_lines, T.StructType([T.StructField("value", T.StringType(), True)]))
        result.write_local = functools.partial(_write_lines_local, spark, splits, kept_of, frame=ranges)
        return result
    # Read by Spark: the records in input order, minus the removed positions
    # (a broadcast join, which keeps the order; its positions pass the driver).
    survivors = numbered.join(F.broadcast(dropped), "_pos", "left_anti")
    if json_col is not None:
        survivors = survivors.where(~F.col(json_col).rlike(blank))
    result.deduped = survivors.drop("_pos")
    return result


# Fingerprints of at most this many documents are joined on the driver (about
# 175 bytes each there: 16 of fingerprint, 144 of verification summary, 8 of
# position); above it the fully distributed path runs.
DRIVER_DOCUMENTS = 20_000_000

_POS_SHIFT = 40  # _pos = file rank << 40 | byte offset (or row) in the file
# Added to the positions of new documents given as a DataFrame with against,
# so that the old ones come first (as files given with --against do).
NEW_AFTER = 1 << 62


_CONFIGS: dict = {}


def _worker_config(key: str, idf: Any) -> Any:
    """The job's configuration in a Python worker, made once per worker
    process (an IDF table is parsed once, not per batch); ``key`` is the full
    configuration's JSON, which names the table by its digest, and ``idf``
    the broadcast bytes of the table."""
    if key not in _CONFIGS:
        _CONFIGS[key] = _rs.config_from_parts(key, idf.value if idf is not None else None)
    return _CONFIGS[key]


def _log(quiet: bool, message: str) -> None:
    if not quiet:
        print(f"neardup.spark: {message}", file=sys.stderr, flush=True)


def _text_buffers(arr: Any) -> tuple:
    try:
        return neardup._string_buffers(arr)
    except TypeError:
        raise neardup.NeardupError(f"the text column holds {arr.type}, not strings") from None


def _to_arrow(frame: Any) -> Any:
    """A DataFrame's rows on the driver as one pyarrow Table."""
    import pyarrow as pa

    if hasattr(frame, "toArrow"):
        return frame.toArrow()
    return pa.Table.from_batches(frame._collect_as_arrow(), schema=None)  # pyspark 3.5


def _file_key(path: str) -> str:
    """A file's path as Spark names it in ``inputFiles()`` and ``_metadata``."""
    from urllib.parse import unquote, urlparse

    u = urlparse(path)
    return unquote(u.path) if u.scheme in ("", "file") else path


class Positions:
    """Input order of rows read from files: ``file rank << 40 | byte offset``
    of a JSON Lines record in its (uncompressed) file, or ``| row`` of a
    Parquet row. It depends only on the files, not on how Spark splits them,
    so every pass over the input finds the same positions; it is computed
    in the Python worker of each pass, from the rows' ``_file`` and ``_start``
    (split start) or ``_row`` columns, with no pass of its own."""

    def __init__(self, ranks: dict, parquet: bool):
        self.ranks = ranks
        self.parquet = parquet

    def __call__(self, b: Any, state: dict) -> Any:
        """Positions of batch ``b``; ``state`` carries a split's running
        offset from one batch of a partition to the next."""
        if "_pos" in b.schema.names:
            return b.column("_pos").to_numpy()
        files = b.column("_file").dictionary_encode()
        rank = np.array([self.ranks[_file_key(f)] for f in files.dictionary.to_pylist()], dtype=np.int64)
        rank = rank[files.indices.to_numpy()] << _POS_SHIFT
        if self.parquet:
            return rank | b.column("_row").to_numpy().astype(np.int64)
        values = b.column("value")
        offs = np.frombuffer(values.buffers()[1], dtype=np.int32)[values.offset : values.offset + len(values) + 1]
        lengths = np.diff(offs).astype(np.int64) + 1  # the line and its newline
        starts = b.column("_start").to_numpy()
        split = rank | starts  # distinct per split (a start is below 2^40)
        pos = np.empty(len(values), dtype=np.int64)
        cuts = np.flatnonzero(np.r_[True, split[1:] != split[:-1], True])
        for x, y in zip(cuts[:-1], cuts[1:]):
            # A run of rows of one split: offsets from where the split stands.
            key = int(split[x])
            at = state[1] if state.get(0) == key else int(starts[x])
            run = np.cumsum(lengths[x:y]) - lengths[x:y] + at
            pos[x:y] = rank[x] | run
            state[0], state[1] = key, int(run[-1] + lengths[y - 1])
        return pos


def read_records(spark: Any, paths: list, fmt: str, against: Optional[list] = None) -> tuple:
    """The input as the command line reads it: one row per JSON Lines record
    (``value``, the line unchanged) or per Parquet row, with ``_new`` (false
    for ``against``'s documents, which come first) and what :class:`Positions`
    needs to number them in input order (files in the order given, folders'
    files by name, then line or row order). Returns (DataFrame, Positions,
    LocalSplits or None): uncompressed JSON Lines files on a local or shared
    file system are read by the executors themselves (:class:`LocalSplits`;
    ``NEARDUP_SPARK_READER=spark`` reads them through Spark instead)."""
    import os

    from pyspark.sql import functions as F

    frames, ranks = [], {}
    for new, group in [(False, against or []), (True, paths)]:
        if not group:
            continue
        frame = spark.read.parquet(*group) if fmt == "parquet" else spark.read.text(group)
        files = sorted(frame.inputFiles(), key=_file_key) if len(group) == 1 else _ordered(frame.inputFiles(), group)
        for f in files:
            ranks.setdefault(_file_key(f), len(ranks))
        if fmt == "parquet":
            frame = frame.select("*", F.col("_metadata.file_path").alias("_file"), F.col("_metadata.row_index").alias("_row"))
        else:
            frame = frame.select("value", F.col("_metadata.file_path").alias("_file"), F.col("_metadata.file_block_start").alias("_start"))
        frames.append(frame.withColumn("_new", F.lit(new)))
    if len(ranks) >= 1 << (63 - _POS_SHIFT):
        raise neardup.NeardupError(f"{len(ranks)} input files: at most {1 << (63 - _POS_SHIFT)}")
    positions = Positions(ranks, fmt == "parquet")
    if fmt != "parquet" and LocalSplits.eligible(list(ranks)) and os.environ.get("NEARDUP_SPARK_READER") != "spark":
        news = set(_file_key(f) for f in (frames[-1].inputFiles() if paths else []))
        files = [(f, r, f in news) for f, r in sorted(ranks.items(), key=lambda x: x[1])]
        splits = LocalSplits(files, spark.sparkContext.defaultParallelism)
        return splits.records(spark), positions, splits
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f)
    return out, positions, None


_BOM = b"\xef\xbb\xbf"  # the UTF-8 byte-order mark

# Compressions Spark (Hadoop) recognises by a file's extension: such files are
# read through Spark, which decompresses them.
_COMPRESSED = (".gz", ".bz2", ".zst", ".zstd", ".deflate", ".lz4", ".snappy", ".xz", ".br")


class LocalSplits:
    """JSON Lines files on a file system every executor sees at the same path
    (local mode, or a mount shared by the cluster), read by the executors'
    Python workers themselves in byte ranges: the texts never pass through
    the JVM (which, turning lines into Arrow batches, used most of a core),
    and the exact check reads only the lines it needs, at their offsets. A
    line belongs to the range holding its first byte; its position is ``file
    rank << 40 | byte offset``, as :class:`Positions` numbers lines read by
    Spark. A UTF-8 byte-order mark before a file's first line is not part of
    the record (as ``neardup dedup`` reads it): that line's position is the
    byte after it."""

    smallest = 8 << 20  # bytes: the smallest range (tests lower it)

    def __init__(self, files: list, cores: int):
        import os

        # (path, rank, new) -> ranges of about a quarter of a core's share,
        # 8 to 128 MB, so that the cores finish together.
        sized = [(path, rank, new, os.path.getsize(path)) for path, rank, new in files]
        total = sum(size for *_, size in sized)
        step = int(min(128 << 20, max(self.smallest, total // max(4 * cores, 1))))
        self.ranges = [
            (path, rank, start, min(start + step, size), new)
            for path, rank, new, size in sized
            for start in range(0, size, step)
        ]

    def paths(self) -> dict:
        """File rank -> path."""
        return {rank: path for path, rank, *_ in self.ranges}

    @staticmethod
    def eligible(files: list) -> bool:
        """Whether every file is a local (or mounted) uncompressed one."""
        return all("://" not in f or f.startswith("file:") for f in files) and not any(
            f.lower().endswith(_COMPRESSED) for f in files
        )

    def frame(self, spark: Any) -> Any:
        """One row per byte range, one range per partition."""
        from pyspark.sql import types as T

        schema = T.StructType([
            T.StructField("path", T.StringType(), False),
            T.StructField("rank", T.LongType(), False),
            T.StructField("start", T.LongType(), False),
            T.StructField("end", T.LongType(), False),
            T.StructField("new", T.BooleanType(), False),
            T.StructField("index", T.LongType(), False),
        ])
        indexed = [r + (i,) for i, r in enumerate(self.ranges)]
        rows = spark.sparkContext.parallelize(indexed, max(len(indexed), 1))
        return spark.createDataFrame(rows, schema)

    def map(self, spark: Any, fn: Any, schema: Any, strip: bool = False) -> Any:
        """``fn`` over the input's records, as ``mapInArrow`` would run it over
        ``value``/``_pos``/``_new`` batches (``value``: the line with its
        newline, unless ``strip``)."""

        def run(batches):
            return fn(read_ranges(batches, strip))

        return self.frame(spark).mapInArrow(run, schema)

    def records(self, spark: Any) -> Any:
        """The records as a DataFrame (``value`` without newlines, ``_pos``,
        ``_new``), for the paths that need Spark to hold them."""
        from pyspark.sql import types as T

        schema = T.StructType([
            T.StructField("value", T.StringType(), True),
            T.StructField("_pos", T.LongType(), False),
            T.StructField("_new", T.BooleanType(), False),
        ])
        return self.map(spark, lambda batches: batches, schema, strip=True)


def read_ranges(batches: Any, strip: bool = False, chunk: int = 16 << 20) -> Any:
    """The records of each byte range of ``batches`` (rows of
    :meth:`LocalSplits.frame`) as Arrow batches of ``value`` (the line, with
    its newline unless ``strip``), ``_pos`` and ``_new``."""
    for b in batches:
        cols = [b.column(c).to_pylist() for c in ("path", "rank", "start", "end", "new")]
        for path, rank, start, end, new in zip(*cols):
            yield from _read_range(path, rank, start, end, new, strip, chunk)


def _read_range(path: str, rank: int, start: int, end: int, new: bool, strip: bool, chunk: int) -> Any:
    local = _file_key(path)
    try:
        f = open(local, "rb")
    except OSError as e:
        raise neardup.NeardupError(f"{local}: cannot read it ({e.strerror}); check the path and its permissions") from None
    with f:
        at = start
        if start > 0:
            # The line that holds byte start - 1 belongs to the range before.
            f.seek(start - 1)
            at = start - 1 + len(f.readline())
        pending = b""
        while at < end:
            data = f.read(chunk)
            eof = len(data) < chunk
            buf = pending + data if pending else data
            if not buf:
                break
            arr = np.frombuffer(buf, dtype=np.uint8)
            ends = np.flatnonzero(arr == 10) + 1
            if eof and (len(ends) == 0 or ends[-1] != len(buf)):
                ends = np.append(ends, len(buf))  # the last line, without a newline
            starts = np.r_[0, ends[:-1]] if len(ends) else ends
            n = int(np.searchsorted(at + starts, end))  # lines that start in the range
            if at == 0 and n and buf.startswith(_BOM):
                starts[0] = min(len(_BOM), int(ends[0]))  # the file's first line, after the mark
            if n:
                yield _lines_batch(buf, starts[:n], ends[:n], (rank << _POS_SHIFT) | (at + starts[:n]), new, strip)
            if n < len(ends) or eof:
                break
            consumed = int(ends[-1]) if len(ends) else 0
            pending = buf[consumed:]
            at += consumed


def _without_newlines(lines: Any) -> Any:
    """Arrow strings without their final newline ("\\n" or "\\r\\n")."""
    if not len(lines):
        return lines
    offs = np.frombuffer(lines.buffers()[1], dtype=np.int32)[lines.offset : lines.offset + len(lines) + 1].astype(np.int64)
    buf = lines.buffers()[2]
    data = memoryview(buf)[: offs[-1]] if buf is not None else b""
    return _lines_batch(data, offs[:-1], offs[1:], np.zeros(len(lines)), False, True).column("value")


def _lines_batch(buf: bytes, starts: Any, ends: Any, pos: Any, new: bool, strip: bool) -> Any:
    """Lines ``buf[starts[i]:ends[i]]`` as an Arrow batch."""
    import pyarrow as pa

    n = len(starts)
    if strip:
        # The lines are contiguous: drop each one's "\n" (and a "\r" before it).
        base = int(starts[0])
        arr = np.frombuffer(buf, dtype=np.uint8)[: int(ends[-1])]
        keep = np.ones(len(arr), dtype=bool)
        keep[:base] = False
        cut = np.zeros(n, dtype=np.int64)
        for ch in (10, 13):  # as Spark's line reader drops them
            last = ends - cut - 1
            has = (last >= starts) & (arr[np.maximum(last, 0)] == ch)
            keep[last[has]] = False
            cut += has
        data = arr[keep].tobytes()
        offsets = np.r_[0, np.cumsum(ends - starts - cut)].astype(np.int32)
    else:
        data = memoryview(buf)[: int(ends[-1])]
        offsets = np.r_[starts, ends[-1]].astype(np.int32)
    value = pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data)])
    return pa.RecordBatch.from_arrays(
        [value, pa.array(np.asarray(pos, dtype=np.int64)), pa.array(np.full(n, new, dtype=bool))],
        names=["value", "_pos", "_new"],
    )


def _write_lines_local(spark: Any, splits: LocalSplits, kept: Any, folder: str, frame: Any = None) -> None:
    """Writes the kept lines into ``folder`` on the local (or shared) file
    system, one ``part-NNNNN.txt`` per byte range in input order, each line
    ending in a newline, from the executors' own reads: the records never
    pass through the JVM. The parts are written into a new folder beside
    ``folder``, which replaces it (with a ``_SUCCESS`` mark) once all are
    there; a part is renamed into place when whole, so a retried task
    rewrites it. ``frame``: the ranges (:meth:`LocalSplits.frame`) with a
    column ``gone`` of each one's removed positions, passed to ``kept``
    with each batch."""
    import os
    import shutil
    import uuid

    import pyarrow as pa
    from pyspark.sql import types as T

    final = _file_key(folder)
    tmp = f"{final.rstrip('/')}.tmp-{uuid.uuid4().hex}"
    os.makedirs(tmp)

    ranges = frame if frame is not None else splits.frame(spark)
    with_gone = frame is not None

    def write_parts(batches):
        for b in batches:
            cols = [b.column(c).to_pylist() for c in ("path", "rank", "start", "end", "new", "index")]
            gones = b.column("gone").to_pylist() if with_gone else [None] * b.num_rows
            for path, rank, start, end, new, index, gone in zip(*cols, gones):
                name = os.path.join(tmp, f"part-{index:05d}.txt")
                part = f"{name}.{uuid.uuid4().hex}"
                rows = 0
                with open(part, "wb") as f:
                    for lines_batch in _read_range(path, rank, start, end, new, False, 16 << 20):
                        lines = kept(lines_batch, gone) if with_gone else kept(lines_batch)
                        if lines is not None:
                            f.write(_with_newlines(lines))
                            rows += len(lines)
                os.replace(part, name)
                yield pa.RecordBatch.from_arrays([pa.array([rows], pa.int64())], names=["rows"])

    try:
        schema = T.StructType([T.StructField("rows", T.LongType(), False)])
        ranges.mapInArrow(write_parts, schema).collect()
        open(os.path.join(tmp, "_SUCCESS"), "wb").close()
        if os.path.isdir(final):
            shutil.rmtree(final)
        elif os.path.exists(final):
            os.remove(final)
        os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _with_newlines(lines: Any) -> Any:
    """Lines as read (each with its line end, the file's last one perhaps
    without) as bytes, each ending in one "\\n": the lines' own bytes
    where every one ends in "\\n" alone (nearly always), else rebuilt."""
    import pyarrow as pa

    n = len(lines)
    offs = np.frombuffer(lines.buffers()[1], dtype=np.int32)[lines.offset : lines.offset + n + 1].astype(np.int64)
    data = np.frombuffer(lines.buffers()[2], dtype=np.uint8)
    ends = offs[1:]
    last = data[ends - 1]  # kept lines are not blank, so never empty
    before = data[np.maximum(ends - 2, offs[:-1])]
    if (last == 10).all() and not ((before == 13) & (ends - 2 >= offs[:-1])).any():
        return memoryview(data[offs[0] : offs[-1]])
    stripped = _without_newlines(lines)
    return b"".join(x + b"\n" for x in stripped.cast(pa.binary()).to_pylist())


def _ordered(files: list, given: list) -> list:
    """Input files in the command line's order: each argument in turn, a
    folder's files by name."""
    keyed = [(_file_key(f), f) for f in files]
    out = []
    for g in given:
        root = _file_key(g if "://" in g else "file://" + __import__("os").path.abspath(g)).rstrip("/")
        mine = sorted(f for f in keyed if f[0] == root or f[0].startswith(root + "/"))
        out += [f for _, f in mine if f not in out]
    out += sorted((f for _, f in keyed if f not in out), key=_file_key)
    return out


def dedup(
    spark: Any,
    df: Any,
    *,
    id_col: str = "id",
    text_col: str = "text",
    json_col: Optional[str] = None,
    order_col: Optional[str] = None,
    k: Optional[int] = None,
    verify: Any = True,
    policy: str = "components",
    keep_by: str = "first",
    against: Any = None,
    config: Any = None,
    idf: Optional[str] = None,
    skip_invalid: bool = False,
    max_group: int = MAX_GROUP,
    vector_col: Optional[str] = None,
    min_similarity: Optional[float] = None,
    driver_documents: int = DRIVER_DOCUMENTS,
    quiet: bool = True,
    positions: Optional[Positions] = None,
    pairs: bool = True,
    splits: Optional[LocalSplits] = None,
    centre: bool = True,
    features_col: Optional[str] = None,
    annotate: bool = False,
    **kwargs: Any,
) -> SparkDedupResult:
    """Near-duplicate pairs, clusters and the deduplicated records of ``df``,
    as ``neardup dedup`` finds them with the same options.

    ``df`` holds texts in ``text_col`` and ids in ``id_col``, or JSON Lines
    records, one per row, in ``json_col`` (their ``text_col`` and ``id_col``
    fields are read, and ``deduped`` keeps the lines unchanged). Input order
    (the first of a cluster is kept) is ``order_col``'s, else the order Spark
    reads ``df`` (which must then read the same way twice: files do).
    ``against``: a DataFrame like ``df`` of documents already clean, preferred
    to every new one and never removed.

    Same defaults as ``neardup dedup`` (and :func:`neardup.dedup`): verification
    at Jaccard 0.8 over candidates from 128-bit token fingerprints centred
    on the corpus, within k = 19 (``centre=False``: plain fingerprints within
    k = 15, as ``--no-centre``); ``verify=False`` for fingerprints alone
    (k = 3 at 64 bits).
    ``policy``: components or incremental; ``keep_by``: first, longest or
    field:NAME[:asc|desc]; ``idf``: an IDF table file (``neardup idf build``)
    for ``weights="tfidf"``, read on the driver and shipped to the executors.
    ``pairs=False``: no list of pairs (``pairs`` is None), only clusters and
    records; with the components policy only the pairs that span the clusters
    are verified, so a cluster of m copies costs about m checks, not m²/2.

    ``features_col``: documents are weighted features instead of texts, as
    ``neardup dedup --features-field``: a column (a map of feature -> weight,
    or its JSON text) or, with ``json_col``, each record's field of that name
    (a JSON object of feature -> weight). Fingerprints of 128 bits (``bits=``,
    ``hash=``, ``seed=``), pairs within the largest k whose estimated cosine
    similarity reaches ``min_similarity`` (default 0.95), not verified.

    ``annotate=True``: ``annotated`` holds every record, kept or not, with
    ``cluster`` (the id of its cluster's representative, its own when it has
    no near-duplicate), ``duplicate_of`` (null when kept) and ``similarity``
    (its best pair's, verified or estimated as cos(pi d / bits); null without
    pairs), as ``neardup dedup --annotate`` writes them: JSON Lines records
    with the three fields appended, columns added to other rows. Every
    candidate pair is then verified (as with ``pairs``).
    """
    import pyarrow as pa
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if vector_col is not None:
        if against is not None or policy != "components" or keep_by != "first" or json_col is not None:
            raise neardup.NeardupError("vectors are deduplicated with policy components and keep_by first, without against")
        if annotate or features_col is not None:
            raise neardup.NeardupError("vectors are not annotated here, nor mixed with weighted features: write the clusters and join them by id")
        return _dedup_vectors(spark, df, id_col=id_col, vector_col=vector_col, k=k, verify=verify, max_group=max_group,
                              min_similarity=min_similarity, **kwargs)
    if policy not in ("components", "incremental"):
        raise neardup.NeardupError(f"policy {policy!r}: use components or incremental")
    weighted = features_col is not None
    if weighted:
        cfg, k = _features_settings(verify, k, config, kwargs, min_similarity, keep_by, against, idf)
        threshold, centred = None, False
    else:
        cfg, k, threshold, centred = _settings(verify, k, config, kwargs, centre, idf)
    idf_bytes = None
    if cfg.idf is not None:
        # Read on the driver, shipped to the executors.
        with open(cfg.idf, "rb") as f:
            idf_bytes = f.read()
    if annotate and json_col is None:
        taken = [c for c in ("cluster", "duplicate_of", "similarity") if c in df.columns]
        if taken:
            raise neardup.NeardupError(f"the input already has a column {taken[0]!r}, which annotate adds: rename it, "
                                       "or write the clusters and join them by id")
    if keep_by != "first" and json_col is None and keep_by != "longest":
        field = keep_by.split(":")[1] if keep_by.startswith("field:") else None
        if field is None or field not in df.columns:
            raise neardup.NeardupError(f"keep_by {keep_by!r}: use first, longest or field:NAME[:asc|desc] with a column of df")
    bits = cfg.bits
    cfg_json = cfg.to_json()
    idf_b = spark.sparkContext.broadcast(idf_bytes) if idf_bytes is not None else None
    stages = {}
    report = _Report(spark)
    t0 = time.monotonic()

    def positioned(frame, new):
        if "_pos" in frame.columns and "_new" in frame.columns:
            return frame
        pos = F.col(order_col).cast("long") if order_col else F.monotonically_increasing_id()
        if new and against is not None:
            pos = pos + F.lit(NEW_AFTER)  # the old documents' positions come first
        return frame.withColumn("_pos", pos).withColumn("_new", F.lit(new))

    if positions is not None:
        records = df  # from read_records: numbered in each pass
        meta = ["_pos"] if splits is not None else ["_file", "_row"] if positions.parquet else ["_file", "_start"]
    else:
        records = positioned(df, True)
        if against is not None:
            records = positioned(against, False).unionByName(records)
        positions = Positions({}, False)
        meta = ["_pos"]
    pos_of = positions
    where_file = {r: f for f, r in positions.ranks.items()}
    body = json_col or features_col or text_col
    # The field a JSON Lines record's body is in.
    field = features_col if weighted else text_col
    for col in [body] + ([] if json_col else [id_col]):
        if col not in records.columns:
            raise neardup.NeardupError(f"the input has no {col!r} column (columns: {[c for c in df.columns]})")
    rule = keep_by if keep_by != "first" else None
    key_field = keep_by.split(":")[1] if (json_col is None and keep_by.startswith("field:")) else None
    skip = skip_invalid

    def rows_of(b, p, summaries, features, fingerprints=True):
        c = _worker_config(cfg_json, idf_b)
        r = _rs.spark_rows(c, *_text_buffers(b.column(body)), json_col is not None, field, id_col,
                           keep_by=rule if (json_col is not None or keep_by == "longest") else None,
                           summaries=summaries, features=features, fingerprints=fingerprints,
                           shares=fingerprints and centred, weighted=weighted)
        if r["errors"] and not skip:
            row, msg = r["errors"][0]
            raise neardup.NeardupError(f"{place_of(int(p[row]))}: {msg}; fix the record, or pass --skip-invalid to skip such records")
        return r, np.frombuffer(r["rows"], dtype=np.uint32)

    def place_of(at):
        """Where the record at position ``at`` is, for messages."""
        if where_file:
            what = "row" if positions.parquet else "the line at byte offset"
            return f"{where_file[at >> _POS_SHIFT]}: {what} {at & ((1 << _POS_SHIFT) - 1)}"
        return f"the record at position {at}"

    out_fields = [
        T.StructField("_pos", T.LongType(), False),
        T.StructField("_new", T.BooleanType(), False),
        T.StructField("_bad", T.BooleanType(), False),
        T.StructField("fp_hi", T.LongType(), False),
        T.StructField("fp_lo", T.LongType(), False),
        T.StructField("_id", T.StringType() if json_col else df.schema[id_col].dataType, True),
    ]
    if threshold is not None:
        out_fields.append(T.StructField("summary", T.BinaryType(), False))
    if centred:
        out_fields.append(T.StructField("shares", T.BinaryType(), False))
    if rule is not None:
        out_fields += [T.StructField("key_kind", T.ByteType(), False), T.StructField("key_num", T.DoubleType(), False), T.StructField("key_str", T.StringType(), True)]
    fp_schema = T.StructType(out_fields)
    def fingerprint_batches(batches):
        import pyarrow as pa
        import pyarrow.compute as pc

        state = {}
        for b in batches:
            p = pa.array(pos_of(b, state))
            r, rows = rows_of(b, p, threshold is not None, False)
            take = pa.array(rows.astype(np.int64))
            fp = np.frombuffer(r["fp"], dtype="<u8").reshape(-1, 2)
            if r["errors"]:
                # Skipped records (--skip-invalid): one row each, marked bad,
                # so that they are counted and left out of the kept records.
                bad = pc.take(p, pa.array([row for row, _ in r["errors"]], type=pa.int64()))
                m = len(bad)
                filler = {"_pos": bad, "_new": pa.array(np.zeros(m, dtype=bool)), "_bad": pa.array(np.ones(m, dtype=bool))}
                yield pa.RecordBatch.from_arrays(
                    [
                        filler[f.name] if f.name in filler else pa.nulls(m, f.type) if f.name == "_id" else pa.array([_zero(f.type)] * m, type=f.type)
                        for f in arrow_schema
                    ],
                    schema=arrow_schema,
                )
            cols = [
                pc.take(p, take),
                pc.take(b.column("_new"), take),
                pa.array(np.zeros(len(rows), dtype=bool)),
                pa.array(fp[:, 0].view(np.int64)),
                pa.array(fp[:, 1].view(np.int64)),
                pa.array(r["ids"], type=pa.string()) if json_col else pc.take(b.column(id_col), take),
            ]
            if threshold is not None:
                cols.append(_fixed_rows(r["summaries"], len(rows)))
            if centred:
                cols.append(_fixed_rows(r["shares"], len(rows)))
            if rule is not None:
                if key_field is not None:
                    kc = pc.take(b.column(key_field), take)
                    if pa.types.is_string(kc.type) or pa.types.is_large_string(kc.type):
                        kind = np.where(pc.is_null(kc).to_numpy(zero_copy_only=False), 2, 1)
                        cols += [pa.array(kind.astype(np.int8)), pa.array(np.zeros(len(rows))), kc.cast(pa.string())]
                    else:
                        nums = kc.cast(pa.float64())
                        kind = np.where(pc.is_null(nums).to_numpy(zero_copy_only=False), 2, 0)
                        cols += [pa.array(kind.astype(np.int8)), pc.fill_null(nums, 0.0), pa.nulls(len(rows), pa.string())]
                else:
                    cols += [
                        pa.array(np.frombuffer(r["key_kind"], dtype=np.int8)),
                        pa.array(np.frombuffer(r["key_num"], dtype=np.float64)),
                        pa.array(r["key_str"], type=pa.string()),
                    ]
            yield pa.RecordBatch.from_arrays(cols, schema=arrow_schema)

    from pyspark.sql.pandas.types import to_arrow_schema

    arrow_schema = to_arrow_schema(fp_schema)
    if splits is not None:
        fps = splits.map(spark, fingerprint_batches, fp_schema)
    else:
        wanted = {c: None for c in meta + ["_new", body] + ([] if json_col else [id_col]) + ([key_field] if key_field else [])}
        fps = records.select(*[_features_json(records, c) if (weighted and c == body and not json_col) else c for c in wanted])
        fps = fps.mapInArrow(fingerprint_batches, fp_schema)
    fps = fps.localCheckpoint()
    # Per kind (skipped or not, new or old): the count and the positions' range.
    kinds = {(bool(r[0]), bool(r[1])): tuple(r[2:]) for r in
             fps.groupBy("_bad", "_new").agg(F.count("*"), F.min("_pos"), F.max("_pos")).collect()}
    n = sum(c for (b, _), (c, *_) in kinds.items() if not b)
    skipped = sum(c for (b, _), (c, *_) in kinds.items() if b)
    fps_all, fps = fps, fps.where(~F.col("_bad"))
    stages["fingerprint"] = time.monotonic() - t0
    _log(quiet, f"fingerprint: {n:,} documents{f' ({skipped:,} invalid records skipped)' if skipped else ''} in {stages['fingerprint']:.1f} s")
    report.documents = n
    report.done("fingerprint", stages["fingerprint"], n, records=n + skipped, skipped=skipped)
    if n > driver_documents:
        if policy != "components" or cfg.idf is not None or weighted or annotate:
            raise neardup.NeardupError(
                f"{n:,} documents are more than the driver joins ({driver_documents:,}): the distributed path "
                "takes texts with policy components, no IDF table and no annotate (or "
                "raise driver_documents, about 175 bytes of driver memory per document)"
            )
        _log(quiet, f"{n:,} documents are more than the driver joins ({driver_documents:,}): the distributed path runs")
        # The records numbered as the fingerprint pass numbered them, with
        # only the data columns (for the kept records when Spark reads them),
        # and every document's text (for the exact check).
        data = [json_col] if json_col else [c for c in records.columns if c not in ("_pos", "_file", "_start", "_row", "_new")]

        def number(batches):
            state: dict = {}
            for b in batches:
                yield pa.RecordBatch.from_arrays([pa.array(pos_of(b, state), pa.int64())] + [b.column(c) for c in data],
                                                 names=["_pos"] + data)

        schema = T.StructType([T.StructField("_pos", T.LongType(), False)] + [records.schema[c] for c in data])
        numbered = records.where(F.col("_new")).select(*{c: None for c in meta + data}).mapInArrow(number, schema)
        texts = numbered.select("_pos", body)
        first_new = None
        old, new = kinds.get((False, False)), kinds.get((False, True))
        if old is not None:
            # Documents already clean (against), numbered before the new ones.
            first_new = new[1] if new is not None else old[2] + 1
            if old[2] >= first_new:
                raise neardup.NeardupError("the documents of against must be numbered before the new ones (order_col)")
            # The exact check reads old documents too.
            texts = records.select(*{c: None for c in meta + data}).mapInArrow(number, schema).select("_pos", body)
        bad = fps_all.where(F.col("_bad")).select("_pos") if skipped else None
        result = _distributed_texts(spark, fps, n, bits=bits, k=k, threshold=threshold, centred=centred, max_group=max_group,
                                    pairs=pairs, quiet=quiet, stages=stages, rows_of=rows_of, splits=splits, texts=texts,
                                    numbered=numbered, json_col=json_col, bad=bad, report=report,
                                    keep_by=rule, first_new=first_new, n_new=new[0] if new is not None else 0)
        return result

    bad_pos = np.array([r[0] for r in fps_all.where(F.col("_bad")).select("_pos").collect()] if skipped else [], dtype=np.int64)
    # Candidates: every fingerprint on the driver, joined as `neardup dedup` joins them.
    t1 = time.monotonic()
    cols = (["_pos", "_new"] + (["shares"] if centred else ["fp_hi", "fp_lo"]) + (["summary"] if threshold is not None else [])
            + (["key_kind", "key_num", "key_str"] if rule else []))
    table = _to_arrow(fps.select(*cols))
    new_flag = table.column("_new").to_numpy(zero_copy_only=False).astype(bool)
    order = np.lexsort((table.column("_pos").to_numpy(), new_flag))
    pos = table.column("_pos").to_numpy()[order]
    n_old = int((~new_flag).sum())
    words = np.empty((n, 2), dtype="<u8")
    if centred:
        # Centred on every document's shares, old and new alike.
        centred_fps = _centred(_packed(table.column("shares").take(order)), bits)
        if bits == 128:
            words[:] = centred_fps
        else:
            words[:, 0], words[:, 1] = 0, centred_fps
        del centred_fps
    else:
        words[:, 0] = table.column("fp_hi").to_numpy().view(np.uint64)[order]
        words[:, 1] = table.column("fp_lo").to_numpy().view(np.uint64)[order]
    sums = None
    if threshold is not None:
        sums = _packed(table.column("summary").take(order))
    keys = None
    if rule:
        new_order = order[n_old:]
        keys = (
            table.column("key_kind").to_numpy().astype(np.uint8)[new_order].tobytes(),
            table.column("key_num").to_numpy().astype(np.float64)[new_order].tobytes(),
            table.column("key_str").take(new_order).to_pylist(),
        )
    del table
    _log(quiet, f"collect: {n:,} fingerprints{' and summaries' if threshold is not None else ''} on the driver in "
         f"{time.monotonic() - t1:.1f} s")
    def exact_check(undecided, kept, scores):
        if splits is not None:
            return _exact_check_direct(spark, splits, rows_of, pos, undecided, threshold, kept, scores)

        def texts(fn, schema):
            return records.select(*{c: None for c in meta + [body]}).mapInArrow(fn, schema)

        return _exact_check(spark, texts, body, pos_of, rows_of, pos, undecided, threshold, kept, scores)
    if pairs or policy != "components" or annotate:
        # (--annotate gives each record its best similarity: every pair verified.)
        kept, scores, undecided = _rs.spark_join(words.tobytes(), bits, k, sums, threshold)
        del words, sums
        kept = np.frombuffer(kept, dtype="<i8").reshape(-1, 3)
        scores = np.frombuffer(scores, dtype="<f8")
        undecided = np.frombuffer(undecided, dtype="<i8").reshape(-1, 3)
        stages["candidates"] = time.monotonic() - t1
        _log(quiet, f"candidates: {len(kept) + len(undecided):,} pairs within k = {k}"
             f"{f', {len(undecided):,} left to the exact check' if threshold is not None else ''} in {stages['candidates']:.1f} s")

        t2 = time.monotonic()
        if len(undecided):
            kept, scores = exact_check(undecided, kept, scores)
        stages["verify"] = time.monotonic() - t2
        if threshold is not None:
            _log(quiet, f"verify: {len(kept):,} pairs at Jaccard >= {threshold} in {stages['verify']:.1f} s")
    else:
        kept, scores = _spanning(spark, words.tobytes(), bits, k, sums, threshold, n, stages, quiet,
                                 lambda und: exact_check(und, np.empty((0, 3), dtype=np.int64), np.empty(0)))
        del words, sums

    t3 = time.monotonic()
    all_pairs = kept  # (the name `kept` is reused below)
    a32, b32 = kept[:, 0].astype(np.uint32), kept[:, 1].astype(np.uint32)
    reps = np.frombuffer(
        _rs.resolve_pairs(n, a32.tobytes(), b32.tobytes(), policy, rule, *(keys or (None, None, None)), old=n_old),
        dtype=np.uint32,
    ).astype(np.int64)
    stages["components"] = time.monotonic() - t3
    moved = np.nonzero(reps != np.arange(n))[0]
    for name in ("candidates", "verify", "components"):
        report.done(name, stages.get(name, 0.0), n)
    in_cluster = np.unique(np.concatenate([moved, reps[moved]]))
    _log(quiet, f"{policy}: {len(moved[moved >= n_old]):,} documents removed in {stages['components']:.2f} s")

    first_new = n_old
    # Pairs of two old documents are not reported; without pairs, none are.
    keep_pairs = (kept[:, 1] >= first_new) & pairs
    pairs_ab = kept[keep_pairs]
    pair_order = np.lexsort((pairs_ab[:, 1], pairs_ab[:, 0]))
    pairs_ab, pair_scores = pairs_ab[pair_order], scores[keep_pairs][pair_order]
    # Clusters with a new member (against's own clusters are not reported).
    has_new = np.zeros(n, dtype=bool)
    has_new[reps[first_new:]] = True
    members = in_cluster[has_new[reps[in_cluster]]]
    members = members[np.lexsort((members, reps[members]))]
    # The ids the outputs name, fetched to the driver (only these).
    named = np.unique(np.concatenate([pairs_ab[:, 0], pairs_ab[:, 1], members, reps[moved]]))
    id_rows = _to_arrow(fps.select("_pos", "_id").join(F.broadcast(_local(spark, {"_pos": pos[named]})), "_pos", "left_semi"))
    id_pos = id_rows.column("_pos").to_numpy()
    by_pos = np.argsort(id_pos)
    id_pos = id_pos[by_pos]
    id_col_values = id_rows.column("_id").take(pa.array(by_pos)).combine_chunks()
    id_texts = id_col_values  # JSON text of each id, for JSON Lines records
    if json_col is not None:
        # Ids as the records hold them: integers if every one is, else strings.
        texts = id_col_values.to_pylist()
        values = [json.loads(x) for x in texts]
        ints = all(not x.startswith('"') for x in texts)
        id_col_values = pa.array(values, type=pa.int64()) if ints else pa.array([str(v) for v in values], type=pa.string())
    del id_rows

    def id_of(docs):
        return id_col_values.take(pa.array(np.searchsorted(id_pos, pos[docs])))

    pair_cols = {"a": id_of(pairs_ab[:, 0]), "b": id_of(pairs_ab[:, 1]), "distance": pa.array(pairs_ab[:, 2])}
    if threshold is not None:
        pair_cols["jaccard"] = pa.array(pair_scores)
    out_pairs = _frame(spark, pa.table(pair_cols)) if pairs else None
    starts = np.flatnonzero(np.r_[True, reps[members][1:] != reps[members][:-1]]) if len(members) else np.array([], dtype=np.int64)
    offsets = np.r_[starts, len(members)].astype(np.int32)
    clusters = _frame(spark, pa.table({
        "representative": id_of(reps[members[starts]]) if len(members) else id_col_values.slice(0, 0),
        "size": pa.array(np.diff(offsets).astype(np.int64)),
        "members": pa.ListArray.from_arrays(pa.array(offsets), id_of(members)),
    }))
    dropped = moved[moved >= first_new]
    drop_df = _local(spark, {"_pos": np.concatenate([pos[dropped], bad_pos])})
    survivors = records.where(F.col("_new"))
    blank = "^[ \\t\\n\\r\\f]*$"  # blank lines are not records (as `neardup dedup` reads them)
    if splits is not None:
        # Read, filtered and cut into lines by the executors; only the kept
        # lines go to Spark's writer.
        gone = spark.sparkContext.broadcast(np.sort(np.concatenate([pos[dropped], bad_pos])))
        keep_schema = T.StructType([T.StructField("value", T.StringType(), True)])

        def kept(b):
            import pyarrow.compute as pc

            keep = b.column("_new").to_numpy(zero_copy_only=False) & ~np.isin(b.column("_pos").to_numpy(), gone.value)
            keep &= ~pc.match_substring_regex(b.column("value"), blank).to_numpy(zero_copy_only=False)
            return b.column("value").filter(pa.array(keep)) if keep.any() else None

        def kept_lines(batches):
            for b in batches:
                lines = kept(b)
                if lines is not None:
                    yield pa.RecordBatch.from_arrays([_without_newlines(lines)], names=["value"])

        deduped = splits.map(spark, kept_lines, keep_schema)
        write_local = functools.partial(_write_lines_local, spark, splits, kept)
    elif meta == ["_pos"]:
        if json_col is not None:
            survivors = survivors.where(~F.col(json_col).rlike(blank))
        survivors = survivors.join(F.broadcast(drop_df), "_pos", "left_anti")
        deduped = survivors.select(json_col) if json_col else survivors.drop("_pos", "_new")
    else:
        # Numbered and filtered in one pass, the records unchanged.
        gone = spark.sparkContext.broadcast(np.sort(np.concatenate([pos[dropped], bad_pos])))
        data = [json_col] if json_col else [c for c in records.columns if c not in ("_file", "_start", "_row", "_new")]
        keep_schema = T.StructType([records.schema[c] for c in data])

        def keep_batches(batches):
            state = {}
            import pyarrow.compute as pc

            for b in batches:
                keep = ~np.isin(pos_of(b, state), gone.value)
                if json_col is not None:
                    keep &= ~pc.match_substring_regex(b.column(json_col), blank).to_numpy(zero_copy_only=False)
                yield pa.RecordBatch.from_arrays([b.column(c).filter(pa.array(keep)) for c in data], names=data)

        deduped = survivors.mapInArrow(keep_batches, keep_schema)
    result = SparkDedupResult(out_pairs, clusters, deduped, stages, json_col is not None, report=report)
    if splits is not None:
        result.write_local = write_local
    if annotate:
        _annotations(spark, result, records=records, splits=splits, kept=all_pairs, scores=scores, reps=reps, pos=pos,
                     first_new=first_new, bits=bits, bad_pos=bad_pos, id_of=id_of, json_of=lambda docs: id_texts.take(
                         pa.array(np.searchsorted(id_pos, pos[docs]))), json_col=json_col, id_col=id_col, field=field,
                     weighted=weighted, meta=meta, pos_of=pos_of, place_of=place_of)
    return result


def _features_settings(verify: Any, k: Optional[int], config: Any, kwargs: dict, min_similarity: Optional[float],
                       keep_by: str, against: Any, idf: Any) -> tuple:
    """The configuration and k of weighted features, as ``neardup dedup
    --features-field`` picks them: 128-bit fingerprints unless ``bits`` says
    otherwise (``hash``, ``seed``; the text pipeline's settings refused), k
    the largest distance whose estimated cosine similarity reaches
    ``min_similarity`` (default 0.95), no verification."""
    if verify not in (True, False, None):
        raise neardup.ConfigError(
            "--verify jaccard:T compares texts; weighted features are paired by estimated cosine similarity: "
            f"set --min-similarity S (default {neardup.DEFAULT_COSINE})")
    if keep_by == "longest":
        raise neardup.ConfigError("--keep-by longest compares texts' lengths; use first or field:NAME for weighted features")
    if against is not None:
        raise neardup.ConfigError("--against takes texts; deduplicate weighted features without it (as neardup dedup)")
    if idf is not None:
        raise neardup.ConfigError("an IDF table weighs a text's features; weighted features come with their weights")
    cos = neardup.DEFAULT_COSINE if min_similarity is None else float(min_similarity)
    if not -1.0 <= cos <= 1.0:
        raise neardup.ConfigError(f"--min-similarity {cos} is out of range: use a similarity in [-1, 1], e.g. 0.9")
    given = {key: value for key, value in kwargs.items() if value is not None}
    cfg = _rs.features_dedup_config(config, json.dumps(given))
    most = cfg.bits // 8
    if k is None:
        k = _rs.default_vector_k(cfg.bits, cos, False)
    if k > most:
        raise neardup.ConfigError(f"--k {k} is too large for {cfg.bits}-bit fingerprints: use at most {most}")
    return cfg, k


def _features_json(frame: Any, col: str) -> Any:
    """Column ``col`` of weighted features as the JSON text of an object of
    feature -> weight (a map or struct column becomes one; a string column
    is taken to hold it already)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if isinstance(frame.schema[col].dataType, T.StringType):
        return F.col(col)
    return F.to_json(F.col(col)).alias(col)


def _annotations(spark: Any, result: SparkDedupResult, *, records, splits, kept, scores, reps, pos, first_new, bits,
                 bad_pos, id_of, json_of, json_col, id_col, field, weighted, meta, pos_of, place_of) -> None:
    """Sets ``result.annotated`` (and its local writer): every new record, in
    input order, with the annotations of ``neardup dedup --annotate``. JSON
    Lines records get the three fields appended by core's
    ``record::annotate`` (the CLI's own code, the same bytes); rows of
    columns get three columns. Only the documents with a pair travel to the
    executors (position, cluster id, duplicate id, best similarity); the
    others are their own cluster, with no similarity."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    n = len(reps)
    best = np.full(n, np.nan)
    if len(kept):
        # The verified score, else the estimate from the distance (as the CLI).
        s = np.where(scores >= 0, scores, np.cos(np.pi * kept[:, 2] / bits))
        np.fmax.at(best, kept[:, 0], s)
        np.fmax.at(best, kept[:, 1], s)
    new = np.arange(first_new, n)
    docs = new[(reps[new] != new) | ~np.isnan(best[new])]
    moved = reps[docs] != docs
    ann = {"pos": pos[docs], "moved": moved, "sim": best[docs]}
    if json_col is not None:
        texts = json_of(reps[docs[moved]]).to_pylist()
        cluster = np.full(len(docs), None, dtype=object)
        cluster[np.flatnonzero(moved)] = texts
        ann["cluster"] = cluster
    else:
        values = id_of(reps[docs[moved]])
        at = np.full(len(docs), -1, dtype=np.int64)
        at[np.flatnonzero(moved)] = np.arange(len(values))
        ann["cluster"] = values.take(pa.array(np.maximum(at, 0))) if len(values) else values
    shared = spark.sparkContext.broadcast(ann)
    gone = spark.sparkContext.broadcast(np.sort(bad_pos))
    blank = "^[ \\t\\n\\r\\f]*$"

    def lookup(p):
        """For positions ``p``: whether each has an annotation, and where."""
        a = shared.value
        if not len(a["pos"]):
            return np.zeros(len(p), dtype=bool), np.zeros(len(p), dtype=np.int64)
        at = np.minimum(np.searchsorted(a["pos"], p), len(a["pos"]) - 1)
        return a["pos"][at] == p, at

    def records_of(b, p, lines):
        """The rows of batch ``b`` that are records (new, not blank, not skipped as invalid)."""
        keep = b.column("_new").to_numpy(zero_copy_only=False).astype(bool) if "_new" in b.schema.names else np.ones(len(p), dtype=bool)
        if len(gone.value):
            keep &= ~np.isin(p, gone.value)
        if lines:
            keep &= ~pc.match_substring_regex(b.column(lines), blank).to_numpy(zero_copy_only=False)
        return keep

    def annotated_lines(values, p, newline):
        """JSON Lines records ``values`` at positions ``p``, annotated."""
        a = shared.value
        hit, at = lookup(p)
        moved = hit & (a["moved"][at] if len(a["pos"]) else hit)
        cluster = np.where(moved, a["cluster"][at] if len(a["pos"]) else None, None).tolist()
        sims = np.where(hit, a["sim"][at] if len(a["pos"]) else np.nan, np.nan).astype("<f8")
        data, offsets, error = _rs.spark_annotate(*_text_buffers(values), field, id_col, weighted, cluster, cluster,
                                                  sims.tobytes(), newline)
        if error is not None:
            row, msg = error
            raise neardup.NeardupError(f"{place_of(int(p[row]))}: {msg}")
        return pa.Array.from_buffers(pa.string(), len(values), [None, pa.py_buffer(offsets), pa.py_buffer(data)])

    if json_col is not None:
        line_schema = T.StructType([T.StructField("value", T.StringType(), True)])
        if splits is not None:
            def local_lines(b):
                p = b.column("_pos").to_numpy()
                keep = records_of(b, p, "value")
                if not keep.any():
                    return None
                return annotated_lines(b.column("value").filter(pa.array(keep)), p[keep], True)

            def lines_of(batches):
                for b in batches:
                    p = b.column("_pos").to_numpy()
                    keep = records_of(b, p, "value")
                    if keep.any():
                        yield pa.RecordBatch.from_arrays([annotated_lines(b.column("value").filter(pa.array(keep)), p[keep], False)], names=["value"])

            result.annotated = splits.map(spark, lines_of, line_schema)
            result.write_annotated_local = functools.partial(_write_lines_local, spark, splits, local_lines)
            return

        def json_batches(batches):
            state: dict = {}
            for b in batches:
                p = pos_of(b, state)
                keep = records_of(b, p, json_col)
                if keep.any():
                    yield pa.RecordBatch.from_arrays([annotated_lines(b.column(json_col).filter(pa.array(keep)), p[keep], False)], names=["value"])

        cols = {c: None for c in meta + ["_new", json_col]}
        result.annotated = records.where(F.col("_new")).select(*cols).mapInArrow(json_batches, line_schema)
        return

    # Columns: the rows with three columns added.
    data = [c for c in records.columns if c not in ("_pos", "_file", "_start", "_row", "_new")]
    id_type = records.schema[id_col].dataType
    schema = T.StructType([records.schema[c] for c in data] + [
        T.StructField("cluster", id_type, True), T.StructField("duplicate_of", id_type, True),
        T.StructField("similarity", T.DoubleType(), True)])
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow_types = {f.name: f.type for f in to_arrow_schema(schema)}

    def column_batches(batches):
        state: dict = {}
        for b in batches:
            p = pos_of(b, state)
            keep = records_of(b, p, None)
            if not keep.any():
                continue
            rows = b.filter(pa.array(keep))
            p = p[keep]
            a = shared.value
            hit, at = lookup(p)
            own = rows.column(id_col)
            if len(a["pos"]):
                moved = hit & a["moved"][at]
                theirs = a["cluster"].take(pa.array(at)).cast(own.type)
                cluster = pc.if_else(pa.array(moved), theirs, own)
                duplicate = pc.if_else(pa.array(moved), theirs, pa.nulls(len(p), own.type))
                sims = np.where(hit, a["sim"][at], np.nan)
            else:
                cluster, duplicate, sims = own, pa.nulls(len(p), own.type), np.full(len(p), np.nan)
            similarity = pa.array(sims, mask=np.isnan(sims), type=pa.float64())
            cols = [rows.column(c) for c in data] + [cluster, duplicate, similarity]
            yield pa.RecordBatch.from_arrays([c.cast(arrow_types[name]) for c, name in zip(cols, schema.fieldNames())],
                                             names=schema.fieldNames())

    cols = {c: None for c in meta + data + ["_new"]}
    result.annotated = records.where(F.col("_new")).select(*cols).mapInArrow(column_batches, schema)


def _buckets(undecided: Any, cap: int = 20_000) -> dict:
    """Routes the exact check: each undecided pair to a bucket, and each of
    its documents to the buckets of its pairs. Pairs of one connected
    component share a bucket (each document travels once); a component of
    more than ``cap`` documents is spread by document, and a pair goes to its
    first document's bucket (its second is copied there).

    Returns the plan, in about 9 bytes per pair and 12 per document:
    ``docs`` (the documents, sorted), the pairs ``i``, ``j`` (indices into
    ``docs``, u32) and ``d`` (distance, u8) sorted by bucket, where bucket b's
    pairs are ``starts[b]:starts[b + 1]``, and the routes ``route_doc``
    (indices into ``docs``) and ``route_bucket``."""
    docs, inv = np.unique(undecided[:, :2], return_inverse=True)
    inv = inv.reshape(-1, 2).astype(np.uint32)
    m = len(docs)
    reps = np.frombuffer(
        _rs.resolve_pairs(m, np.ascontiguousarray(inv[:, 0]).tobytes(), np.ascontiguousarray(inv[:, 1]).tobytes(), "components"),
        dtype=np.uint32,
    )
    size = np.bincount(reps, minlength=m)
    buckets = max(1, -(-m // cap))
    key = np.where(size[reps] > cap, np.arange(m, dtype=np.uint64), reps.astype(np.uint64))
    doc_bucket = ((key * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(33)) % np.uint64(buckets)
    del key, reps, size
    pair_bucket = doc_bucket[inv[:, 0]]
    order = np.argsort(pair_bucket, kind="stable")
    starts = np.searchsorted(pair_bucket[order], np.arange(buckets + 1, dtype=np.uint64))
    # A pair's first document is in its bucket; its second only when the two
    # share a bucket, else it is copied there (one route per document and bucket).
    away = doc_bucket[inv[:, 1]] != pair_bucket
    home = np.zeros(m, dtype=bool)
    home[inv[:, 0]] = True
    home[inv[~away, 1]] = True
    own = np.flatnonzero(home)
    away = np.flatnonzero(away)
    copies = np.unique(inv[away, 1].astype(np.uint64) * np.uint64(buckets) + pair_bucket[away])
    return {
        "docs": docs,
        "i": inv[order, 0],
        "j": inv[order, 1],
        "d": undecided[order, 2].astype(np.uint8),
        "starts": starts,
        "route_doc": np.concatenate([own, (copies // np.uint64(buckets)).astype(np.int64)]),
        "route_bucket": np.concatenate([doc_bucket[own], copies % np.uint64(buckets)]).astype(np.int64),
        "buckets": buckets,
    }


# Undecided pairs checked per spanning round beyond its spanning forest: at
# most about 100 bytes each on the driver while a round routes them (its
# pairs, their routes and the plan the executors receive, 9 bytes a pair).
# Each further round joins the fingerprints again and reads the input again,
# so the budget is set for one round on corpora of tens of GB.
SPAN_BUDGET = 12_000_000


def _spanning(spark, words, bits, k, sums, threshold, n, stages, quiet, check):
    """The verified pairs that span the components, without the full list of
    pairs (whose count is quadratic in a cluster's size): rounds of the join,
    each keeping only candidate pairs that can still join two components of
    the pairs verified so far (a spanning forest of the undecided ones, then
    more up to SPAN_BUDGET), checked exactly by ``check``, until a round's
    undecided pairs all fitted its budget or its forest pairs all passed."""
    labels = np.arange(n, dtype=np.uint32)
    failed = np.empty((0, 2), dtype=np.uint32)
    kept_parts, score_parts = [], []
    stages["candidates"] = stages["verify"] = 0.0
    rounds = candidates = 0
    while True:
        rounds += 1
        t = time.monotonic()
        by_pair = np.lexsort((failed[:, 1], failed[:, 0]))
        k_r, s_r, und, forest, complete = _rs.spark_span(words, bits, k, sums, threshold, labels.tobytes(),
                                                         np.ascontiguousarray(failed[by_pair]).tobytes(), SPAN_BUDGET)
        k_r = np.frombuffer(k_r, dtype="<i8").reshape(-1, 3)
        und = np.frombuffer(und, dtype="<i8").reshape(-1, 3)
        kept_parts.append(k_r)
        score_parts.append(np.frombuffer(s_r, dtype="<f8"))
        candidates += len(k_r) + len(und)
        took = time.monotonic() - t
        stages["candidates"] += took
        _log(quiet, f"candidates, round {rounds}: {len(k_r):,} pairs kept by the summaries, {len(und):,} left to the "
             f"exact check in {took:.1f} s")
        t = time.monotonic()
        if len(und):
            v, vs = check(und)
            kept_parts.append(v)
            score_parts.append(vs)
            passed = np.isin(und[:, 0] * n + und[:, 1], v[:, 0] * n + v[:, 1])
            failed = np.concatenate([failed, und[~passed, :2].astype(np.uint32)])
            # Every forest pair passed: the pairs left out joined documents the
            # forest connects, now by verified pairs.
            complete = complete or bool(passed[:forest].all())
            _log(quiet, f"verify, round {rounds}: {len(v):,} of {len(und):,} pairs at Jaccard >= {threshold} "
                 f"in {time.monotonic() - t:.1f} s")
        stages["verify"] += time.monotonic() - t
        if complete:
            break
        edges = np.concatenate(kept_parts)
        labels = np.frombuffer(
            _rs.resolve_pairs(n, edges[:, 0].astype(np.uint32).tobytes(), edges[:, 1].astype(np.uint32).tobytes(),
                              "components", None, None, None, None, old=0),
            dtype=np.uint32,
        ).copy()
    kept, scores = np.concatenate(kept_parts), np.concatenate(score_parts)
    _log(quiet, f"candidates: {candidates:,} pairs that could join two clusters, in {rounds} round{'s' if rounds > 1 else ''}"
         f" of the join within k = {k} ({stages['candidates']:.1f} s)")
    if threshold is not None:
        _log(quiet, f"verify: {len(kept):,} pairs at Jaccard >= {threshold}, enough to span the clusters "
             f"({len(failed):,} below) in {stages['verify']:.1f} s")
    return kept, scores


def _exact_check(spark, map_records, body, pos_of, rows_of, pos, undecided, threshold, kept, scores):
    """The exact Jaccard check of the pairs the summaries could not decide:
    their documents read again (only these texts move), each sent to the
    buckets of its pairs, and each bucket's pairs measured in Rust.
    ``map_records(fn, schema)`` runs ``fn`` over the input's batches."""
    import pyarrow as pa
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    plan = _buckets(undecided)
    docs, buckets = plan.pop("docs"), plan["buckets"]
    plan["held"] = pos[docs]  # each document's position in the input
    route_doc, route_bucket = plan.pop("route_doc"), plan.pop("route_bucket")
    shared = spark.sparkContext.broadcast(plan)
    routes = _local(spark, {"_pos": plan["held"][route_doc], "bucket": route_bucket})
    # About one bucket's worth of documents (at most 20,000) per task, so that
    # a Python worker holds a bounded share of the texts however many move.
    cores = spark.sparkContext.defaultParallelism
    parts = max(cores, min(buckets, max(4 * cores, -(-len(route_doc) // 20_000))))
    del route_doc, route_bucket
    needed = spark.sparkContext.broadcast(np.sort(plan["held"]))
    text_schema = T.StructType([T.StructField("_pos", T.LongType(), False), T.StructField(body, T.StringType(), True)])

    def needed_rows(batches):
        # Numbered in the worker; only the documents to check go back.
        state = {}
        want = needed.value
        for b in batches:
            p = pos_of(b, state)
            at = np.minimum(np.searchsorted(want, p), len(want) - 1)
            mine = want[at] == p
            if mine.any():
                yield pa.RecordBatch.from_arrays([pa.array(p[mine]), b.column(body).filter(pa.array(mine))], names=["_pos", body])

    texts = map_records(needed_rows, text_schema)
    routed = texts.join(F.broadcast(routes), "_pos").repartition(parts, "bucket")
    t = threshold

    def check(batches):
        got = [b for b in batches]
        if not got:
            return
        table = pa.Table.from_batches(got)
        p = shared.value
        mine = np.unique(table.column("bucket").to_numpy())
        starts = p["starts"]
        sel = np.concatenate([np.arange(starts[x], starts[x + 1]) for x in mine]) if len(mine) else np.array([], dtype=np.int64)
        # Each document once, however many buckets of this partition hold it.
        ps = table.column("_pos").to_numpy()
        _, first = np.unique(ps, return_index=True)
        one = table.take(pa.array(first))
        sets = []
        for batch in one.to_batches(max_chunksize=32768):
            r, rows = rows_of(batch, batch.column("_pos").to_numpy(), False, True, fingerprints=False)
            sets += r["features"]
        held = one.column("_pos").to_numpy()  # sorted: np.unique's order
        i, j = p["i"][sel], p["j"][sel]
        a = np.searchsorted(held, p["held"][i]).astype(np.uint32)
        b = np.searchsorted(held, p["held"][j]).astype(np.uint32)
        js = np.array(_rs.exact_indexed(sets, a.tobytes(), b.tobytes(), t))
        yield _scored(i, j, p["d"][sel], js, t)

    exact = _to_arrow(routed.mapInArrow(check, _scored_schema()))
    shared.unpersist()
    needed.unpersist()
    return _with_scored(exact, docs, kept, scores)


def _scored_schema() -> Any:
    from pyspark.sql import types as T

    return T.StructType([T.StructField(c, T.LongType(), False) for c in "ijd"] + [T.StructField("score", T.DoubleType(), False)])


def _scored(i: Any, j: Any, d: Any, js: Any, threshold: float) -> Any:
    """The pairs ``(i, j, d)`` whose exact scores ``js`` reach the threshold,
    as an Arrow batch of the exact check's output."""
    import pyarrow as pa

    keep = js >= threshold
    return pa.RecordBatch.from_arrays(
        [pa.array(v[keep].astype(np.int64)) for v in (i, j, d)] + [pa.array(js[keep])],
        names=["i", "j", "d", "score"],
    )


def _with_scored(exact: Any, docs: Any, kept: Any, scores: Any) -> tuple:
    """``kept`` and ``scores`` with the exact check's pairs (which name
    documents by their index in ``docs``)."""
    if exact.num_rows:
        ijd = np.column_stack([exact.column(c).to_numpy() for c in "ijd"])
        ijd[:, 0], ijd[:, 1] = docs[ijd[:, 0]], docs[ijd[:, 1]]
        kept = np.concatenate([kept, ijd])
        scores = np.concatenate([scores, exact.column("score").to_numpy()])
    return kept, scores


def _exact_check_direct(spark, splits, rows_of, pos, undecided, threshold, kept, scores):
    """:func:`_exact_check` where the executors read the input themselves
    (:class:`LocalSplits`): each task reads its buckets' documents at their
    byte offsets, with no pass over the whole input and no shuffle of texts."""
    from pyspark.sql import types as T

    plan = _buckets(undecided)
    docs, buckets = plan.pop("docs"), plan["buckets"]
    plan["held"] = pos[docs]
    del plan["route_doc"], plan["route_bucket"]
    shared = spark.sparkContext.broadcast(plan)
    paths = spark.sparkContext.broadcast(splits.paths())
    cores = spark.sparkContext.defaultParallelism
    tasks = spark.sparkContext.parallelize([(b,) for b in range(buckets)], max(1, min(buckets, 4 * cores)))
    t = threshold

    def check(batches):
        p = shared.value
        for b in batches:
            for x in b.column("bucket").to_pylist():
                sel = np.arange(p["starts"][x], p["starts"][x + 1])
                if not len(sel):
                    continue
                i, j = p["i"][sel], p["j"][sel]
                need = np.unique(np.concatenate([i, j]))
                held = p["held"][need]
                order = np.argsort(held, kind="stable")
                lines = read_lines_at(paths.value, held[order])
                r, rows = rows_of(lines, held[order], False, True, fingerprints=False)
                if len(rows) != len(need):
                    raise neardup.NeardupError("the input changed while the job ran: a document to check is no longer where it was read")
                # Feature sets in `need`'s order.
                sets = [None] * len(need)
                for at, s in zip(order[rows], r["features"]):
                    sets[at] = s
                a = np.searchsorted(need, i).astype(np.uint32)
                c = np.searchsorted(need, j).astype(np.uint32)
                js = np.array(_rs.exact_indexed(sets, a.tobytes(), c.tobytes(), t))
                yield _scored(i, j, p["d"][sel], js, t)

    frame = spark.createDataFrame(tasks, T.StructType([T.StructField("bucket", T.LongType(), False)]))
    exact = _to_arrow(frame.mapInArrow(check, _scored_schema()))
    shared.unpersist()
    paths.unpersist()
    return _with_scored(exact, docs, kept, scores)


def read_lines_at(paths: dict, positions: Any) -> Any:
    """The lines (with their newlines) starting at ``positions`` (``file rank
    << 40 | byte offset``, ascending; ``paths``: rank -> file) as an Arrow
    batch of ``value``."""
    import pyarrow as pa

    mask = (1 << _POS_SHIFT) - 1
    pieces = []
    f, rank = None, None
    try:
        for p in positions.tolist():
            if p >> _POS_SHIFT != rank:
                if f is not None:
                    f.close()
                rank = p >> _POS_SHIFT
                try:
                    f = open(paths[rank], "rb")
                except OSError as e:
                    raise neardup.NeardupError(f"{paths[rank]}: cannot read it ({e.strerror})") from None
            f.seek(p & mask)
            pieces.append(f.readline())
    finally:
        if f is not None:
            f.close()
    lengths = np.fromiter((len(x) for x in pieces), dtype=np.int64, count=len(pieces))
    offsets = np.r_[0, np.cumsum(lengths)].astype(np.int32)
    value = pa.Array.from_buffers(pa.string(), len(pieces), [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"".join(pieces))])
    return pa.RecordBatch.from_arrays([value], names=["value"])


def _frame(spark: Any, table: Any) -> Any:
    """A DataFrame of a driver-side pyarrow Table."""
    try:
        return spark.createDataFrame(table)  # pyspark 4
    except TypeError:
        from pyspark.sql.pandas.types import from_arrow_schema

        spark.conf.set("spark.sql.execution.arrow.pyspark.enabled", "true")
        return spark.createDataFrame(table.to_pandas(), schema=from_arrow_schema(table.schema))


def _zero(t: Any) -> Any:
    import pyarrow as pa

    if pa.types.is_binary(t):
        return b""
    if pa.types.is_string(t):
        return ""
    if pa.types.is_boolean(t):
        return False
    return 0


def _local(spark: Any, columns: dict) -> Any:
    """A DataFrame of driver-side numpy columns (int64 or float64), by Arrow."""
    import pyarrow as pa
    from pyspark.sql import types as T

    table = pa.table({name: pa.array(np.asarray(v)) for name, v in columns.items()})
    if table.num_rows == 0:
        types = {pa.int64(): T.LongType(), pa.float64(): T.DoubleType()}
        schema = T.StructType([T.StructField(f.name, types[f.type]) for f in table.schema])
        return spark.createDataFrame([], schema)
    try:
        return spark.createDataFrame(table)  # pyspark 4
    except TypeError:
        spark.conf.set("spark.sql.execution.arrow.pyspark.enabled", "true")
        return spark.createDataFrame(table.to_pandas())


def _arrow_type(t: Any) -> Any:
    import pyarrow as pa
    from pyspark.sql import types as T

    return {
        T.LongType: pa.int64(),
        T.BinaryType: pa.binary(),
        T.DoubleType: pa.float64(),
        T.BooleanType: pa.bool_(),
        T.StringType: pa.string(),
        T.ByteType: pa.int8(),
        T.IntegerType: pa.int32(),
    }[type(t)]


# Edges of the components stage joined by one task once each partition's
# own union-find has reduced them (16 bytes each, about 40 in the task).
ONE_TASK_EDGES = 10_000_000
# Edges joined by one task's union-find (16 bytes each, and as much again
# for its nodes) when their count is known.
EDGES_PER_TASK = 4_000_000


def _keepers(reps: Any, fps: Any, rule: str, first_new: Optional[int] = None) -> Any:
    """(_pos, rep) with each component's kept document by ``rule``
    (``longest`` or ``field:NAME[:asc|desc]``), as ``neardup dedup
    --keep-by`` orders them: numbers before strings (reversed when
    descending), documents without the field last, ties to the first in
    input order. ``reps``: each member's component (its smallest position);
    ``fps``: the keys (``key_kind`` 0 number, 1 string, 2 missing).
    ``first_new``: old documents (positions before it) are preferred to
    every new one, in input order, as ``--against`` prefers them."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    desc = rule == "longest" or rule.endswith(":desc")
    missing = F.col("key_kind") == 2
    # Keys of documents without one are equal (the input order decides).
    keys = [F.col("key_kind"), F.when(missing, F.lit(0.0)).otherwise(F.col("key_num")),
            F.when(missing, F.lit(None)).otherwise(F.col("key_str"))]
    keyed = reps.join(fps.select("_pos", "key_kind", "key_num", "key_str"), "_pos")
    new = F.col("_pos") >= first_new if first_new is not None else None
    mask = (lambda c: F.when(new, c)) if new is not None else (lambda c: c)  # noqa: E731
    order = [mask(missing).asc(), *[mask(k).desc() if desc else mask(k).asc() for k in keys], F.col("_pos").asc()]
    if new is not None:
        order.insert(0, new.asc())
    best = (
        keyed.withColumn("_r", F.row_number().over(Window.partitionBy("rep").orderBy(*order)))
        .where(F.col("_r") == 1)
        .select(F.col("rep").alias("_comp"), F.col("_pos").alias("_keeper"))
    )
    return reps.join(best, reps["rep"] == best["_comp"]).select("_pos", F.col("_keeper").alias("rep")).localCheckpoint()


def _union_find(a: Any, b: Any) -> tuple:
    """Nodes (sorted) and each one's component's smallest node, for edges
    ``a``-``b`` (int64 arrays)."""
    nodes, inv = np.unique(np.concatenate([a, b]), return_inverse=True)
    inv = inv.astype(np.uint32)
    m = len(a)
    reps = np.frombuffer(_rs.resolve_pairs(len(nodes), inv[:m].tobytes(), inv[m:].tobytes(), "components"), dtype=np.uint32)
    return nodes, nodes[reps]


def _components(spark: Any, edges: Any, max_rounds: int = 64, count: Optional[int] = None) -> Any:
    """(_pos, rep) for every node of an edge (``a``, ``b``), rep the smallest
    node of its connected component.

    Each partition's edges are first joined by a union-find in its task,
    which leaves at most one edge per node it holds (a star per local
    component, no shuffle); given their ``count``, the edges are first
    gathered into partitions of about EDGES_PER_TASK (no shuffle), so that
    many small ones do not each cost a task. If at most ONE_TASK_EDGES remain, one task
    joins them; else large-star / small-star (Kiveris et al., SoCC 2014)
    rounds, until a round changes no edge."""
    import pyarrow as pa
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    schema = T.StructType([T.StructField("u", T.LongType(), False), T.StructField("v", T.LongType(), False)])

    def stars(batches, every=False):
        got = [b for b in batches if b.num_rows]
        if not got:
            return
        t = pa.Table.from_batches(got)
        nodes, reps = _union_find(t.column(0).to_numpy(), t.column(1).to_numpy())
        keep = np.ones(len(nodes), dtype=bool) if every else nodes != reps
        yield pa.RecordBatch.from_arrays([pa.array(nodes[keep]), pa.array(reps[keep])], names=["u", "v"])

    if count is not None:
        edges = edges.coalesce(max(spark.sparkContext.defaultParallelism, -(-count // EDGES_PER_TASK)))
    e = edges.select(F.col("a").alias("u"), F.col("b").alias("v")).mapInArrow(stars, schema).localCheckpoint()
    if e.count() <= ONE_TASK_EDGES:
        out = e.coalesce(1).mapInArrow(functools.partial(stars, every=True), schema)
        return out.select(F.col("u").alias("_pos"), F.col("v").alias("rep")).localCheckpoint()
    e = e.select(F.greatest("u", "v").alias("u"), F.least("u", "v").alias("v")).distinct().localCheckpoint()
    for _ in range(max_rounds):
        # Large star: every neighbour larger than u links to u's smallest neighbour-or-self.
        sym = e.union(e.select(F.col("v").alias("u"), F.col("u").alias("v")))
        m = sym.groupBy("u").agg(F.min("v").alias("m")).withColumn("m", F.least("u", "m"))
        large = sym.join(m, "u").where(F.col("v") > F.col("u")).select(F.col("v").alias("u"), F.col("m").alias("v"))
        large = large.where("u != v").distinct()
        # Small star: u and its smaller neighbours link to the smallest of them.
        m2 = large.groupBy("u").agg(F.min("v").alias("m"))
        small = (
            large.join(m2, "u")
            .select(F.explode(F.array("u", "v")).alias("x"), "m")
            .where("x != m")
            .select(F.col("x").alias("u"), F.col("m").alias("v"))
            .distinct()
            .localCheckpoint()
        )
        changed = small.exceptAll(e).count() + e.exceptAll(small).count()
        e = small
        if changed == 0:
            break
    else:
        raise RuntimeError("connected components did not converge")
    # Now a star per component: (node, smallest node).
    nodes = e.select(F.col("u").alias("_pos"), F.col("v").alias("rep"))
    roots = e.select(F.col("v").alias("_pos"), F.col("v").alias("rep")).distinct()
    return nodes.union(roots).distinct().localCheckpoint()


def write(result: SparkDedupResult, output: str, fmt: str = "parquet") -> dict:
    """Writes DIR/pairs, DIR/clusters, DIR/deduped and, with annotations,
    DIR/annotated (JSON Lines records stay the lines they were with
    ``jsonl``, annotated ones with the three fields appended; with
    ``parquet`` they become columns). Returns the seconds each took."""
    if fmt not in ("parquet", "jsonl"):
        raise ValueError(f"format {fmt!r}: use parquet or jsonl")
    took = {}
    local = {"deduped": result.write_local, "annotated": result.write_annotated_local}
    for name, frame in [("pairs", result.pairs), ("clusters", result.clusters), ("deduped", result.deduped),
                        ("annotated", result.annotated)]:
        if frame is None:
            continue
        t = time.monotonic()
        if name in local and result.json_records:
            if fmt == "jsonl" and local[name] is not None and ("://" not in output or output.startswith("file:")):
                local[name](f"{output}/{name}")
                took[name] = time.monotonic() - t
                continue
            if fmt == "jsonl":
                frame.write.mode("overwrite").text(f"{output}/{name}")
                took[name] = time.monotonic() - t
                continue
            frame = _parse_json(frame)
        w = frame.write.mode("overwrite")
        if fmt == "parquet":
            w.parquet(f"{output}/{name}")
        else:
            w.json(f"{output}/{name}")
        took[name] = time.monotonic() - t
    return took


def _parse_json(lines: Any) -> Any:
    """JSON Lines records (one string column) as a DataFrame of their fields."""
    from pyspark.sql import DataFrame

    spark = lines.sparkSession
    col = lines.columns[0]
    try:
        jvm = spark._jvm
        strings = getattr(lines.select(col)._jdf, "as")(jvm.org.apache.spark.sql.Encoders.STRING())
        return DataFrame(spark._jsparkSession.read().json(strings), spark)
    except Exception:  # Spark Connect: no JVM handle
        return spark.read.json(lines.rdd.map(lambda r: r[0]))


def _session(master: Optional[str], driver_memory: Optional[str] = None) -> Any:
    import os

    from pyspark.sql import SparkSession

    b = SparkSession.builder.appName("neardup dedup")
    if driver_memory:
        b = b.config("spark.driver.memory", driver_memory)
    if master:
        b = b.master(master)
        if master.startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            b = b.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
            b = b.config("spark.ui.enabled", "false")
    b = b.config("spark.sql.execution.arrow.pyspark.enabled", "true").config("spark.ui.showConsoleProgress", "false")
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def _write_report(path: str, result: SparkDedupResult, seconds: float) -> None:
    """The run's ``--report``: per stage its seconds, rows and bytes
    shuffled, and the driver's peak memory, as JSON."""
    report = result.report or _Report(None)
    report.done("write", result.stages.get("write", 0.0), report.documents)
    out = {"documents": report.documents, "seconds": round(seconds, 3), "stages": report.stages, "driver": report.driver_memory()}
    with open(path, "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")


def _error_message(e: BaseException) -> str:
    """The neardup message inside a Spark task failure, else the error."""
    import re

    text = str(e)
    m = re.search(r"NeardupError: (.*)", text)
    return m.group(1).strip() if m else text.splitlines()[0] if text else type(e).__name__


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m neardup.spark", description="Near-duplicate detection on Apache Spark, with the answers of `neardup dedup`.")
    sub = ap.add_subparsers(dest="command", required=True)
    d = sub.add_parser("dedup", help="pairs, clusters and deduplicated records of a corpus")
    d.add_argument("--input", required=True, nargs="+", help="JSON Lines (.gz too) or Parquet files or folders")
    d.add_argument("--output", required=True, help="output folder: pairs/, clusters/, deduped/")
    d.add_argument("--input-format", choices=["auto", "jsonl", "parquet"], default="auto")
    d.add_argument("--output-format", "--format", dest="format", choices=["parquet", "jsonl"], default="parquet",
                   help="format of the outputs (as neardup dedup --output-format; --format is its older spelling)")
    d.add_argument("--id-field", default="id")
    d.add_argument("--text-field", default="text")
    d.add_argument("--k", type=int)
    d.add_argument("--verify", help="jaccard:T (default jaccard:0.8)")
    d.add_argument("--no-verify", action="store_true", help="decide by Hamming distance alone")
    d.add_argument("--no-centre", action="store_true", help="candidates from plain fingerprints, not centred on the corpus (as neardup dedup --no-centre)")
    d.add_argument("--policy", choices=["components", "incremental"], default="components")
    d.add_argument("--keep-by", default="first", help="first, longest or field:NAME[:asc|desc]")
    d.add_argument("--against", nargs="+", help="documents already clean: pairs with them are reported, they are never removed")
    d.add_argument("--config", help="a configuration file (neardup config)")
    d.add_argument("--profile", choices=["native", "python-simhash"])
    d.add_argument("--bits", type=int, choices=[64, 128])
    d.add_argument("--features", help="tokens, shingles:W or ngrams:N")
    d.add_argument("--tokenizer", choices=["auto", "words", "jieba", "chars"])
    d.add_argument("--weights", choices=["tf", "binary", "tfidf", "textrank"])
    d.add_argument("--idf", help="an IDF table from `neardup idf build` (implies --weights tfidf), shipped to the executors")
    d.add_argument("--top", type=int)
    d.add_argument("--hash", choices=["xxh3", "fnv1a", "md5", "siphash"])
    d.add_argument("--seed", type=int)
    d.add_argument("--stopwords", action="store_true")
    d.add_argument("--html", action="store_true")
    d.add_argument("--skip-invalid", action="store_true", help="skip malformed records and count them, instead of failing")
    d.add_argument("--no-pairs", action="store_true",
                   help="write clusters and records only: with --policy components, only the pairs that span "
                        "the clusters are verified (a cluster of m copies costs about m checks, not m^2/2)")
    d.add_argument("--driver-documents", type=int, default=DRIVER_DOCUMENTS,
                   help="join on the driver up to this many documents (about 175 bytes of driver memory each), else distribute")
    d.add_argument("--max-group", type=int, default=MAX_GROUP,
                   help="distributed path: split join groups of more rows than this into block pairs (skew)")
    d.add_argument("--vector-column", help="dedup dense vectors (an array of numbers) in this column instead of texts")
    d.add_argument("--min-similarity", type=float,
                   help="with --vector-column or --features-field: the cosine threshold (default 0.95); for weighted "
                        "features, k is the largest distance whose estimated similarity reaches it")
    d.add_argument("--features-field", nargs="?", const="features", metavar="NAME",
                   help="documents are weighted features in this field (column), an object (map) of feature -> weight, "
                        "instead of texts (--features-field alone: the field \"features\"), as neardup dedup --features-field")
    d.add_argument("--annotate", action="store_true",
                   help="also write annotated/: every record, kept or not, with \"cluster\", \"duplicate_of\" and "
                        "\"similarity\" added (as neardup dedup --annotate; columns added to Parquet rows)")
    d.add_argument("--report", metavar="FILE",
                   help="write a JSON report: per stage its seconds, rows and bytes shuffled (per document too), "
                        "and the driver's peak memory")
    d.add_argument("--master", help="Spark master, e.g. local[2] (default: from spark-submit)")
    d.add_argument("--driver-memory", help="e.g. 4g (local mode; under spark-submit use its own flag)")
    d.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    args = ap.parse_args(argv)
    quiet = args.quiet

    def fail(msg):
        print(f"neardup.spark: error: {msg}", file=sys.stderr)
        return 2

    import os

    for path in args.input + (args.against or []):
        if "://" not in path and not os.path.exists(path):
            return fail(f"{path}: no such file or folder")
    fmt = args.input_format
    if fmt == "auto":
        fmt = "parquet" if all(p.rstrip("/").endswith(".parquet") for p in args.input) else "jsonl"
    if args.vector_column and (args.against or args.policy != "components" or args.keep_by != "first"):
        return fail("--vector-column takes --policy components and --keep-by first, without --against")
    if args.features_field and args.against:
        return fail("--against takes texts; deduplicate weighted features without it (as neardup dedup)")
    if args.vector_column and (args.features_field or args.annotate):
        return fail("--vector-column takes neither --features-field nor --annotate")
    if args.min_similarity is not None and not (args.vector_column or args.features_field):
        return fail("--min-similarity goes with --vector-column or --features-field (texts: use --k)")
    verify = False if args.no_verify else (True if args.verify is None else args.verify)
    kwargs = {
        k: v
        for k, v in [
            ("bits", args.bits), ("features", args.features), ("tokenizer", args.tokenizer), ("weights", args.weights),
            ("seed", args.seed), ("top", args.top), ("hash", args.hash), ("profile", args.profile),
            ("stopwords", True if args.stopwords else None), ("html", True if args.html else None),
        ]
        if v is not None
    }
    config = None
    if args.config:
        # Flags given as well override its settings, as with `neardup dedup`.
        try:
            config = neardup.FingerprintConfig.load(args.config, idf=args.idf)
        except (OSError, ValueError) as e:
            return fail(f"{args.config}: {e}")
    spark = _session(args.master, args.driver_memory)
    started = time.monotonic()
    try:
        if args.vector_column:
            df = spark.read.parquet(*args.input) if fmt == "parquet" else spark.read.json(args.input)
            for col in (args.id_field, args.vector_column):
                if col not in df.columns:
                    return fail(f"the input has no {col!r} column (columns: {df.columns}); use --id-field/--vector-column")
            kw = {k: v for k, v in kwargs.items() if k in ("bits", "seed")}
            result = dedup(spark, df, id_col=args.id_field, k=args.k, verify=verify,
                           max_group=args.max_group, vector_col=args.vector_column, min_similarity=args.min_similarity, **kw)
        else:
            records, positions, splits = read_records(spark, args.input, fmt, args.against)
            if fmt == "parquet":
                for col in (args.id_field, args.features_field or args.text_field):
                    if col not in records.columns:
                        flag = "--features-field" if args.features_field else "--text-field"
                        return fail(f"the input has no {col!r} column (columns: {[c for c in records.columns if not c.startswith('_')]}); use --id-field/{flag}")
            result = dedup(
                spark, records, id_col=args.id_field, text_col=args.text_field,
                json_col="value" if fmt == "jsonl" else None, k=args.k,
                verify=verify, policy=args.policy, keep_by=args.keep_by,
                config=config, idf=args.idf, skip_invalid=args.skip_invalid, max_group=args.max_group,
                driver_documents=args.driver_documents, quiet=quiet, pairs=not args.no_pairs, positions=positions,
                splits=splits, centre=not args.no_centre, features_col=args.features_field,
                annotate=args.annotate, min_similarity=args.min_similarity, **kwargs,
            )
        took = write(result, args.output, args.format)
        result.stages["write"] = sum(took.values())
        if args.report:
            _write_report(args.report, result, time.monotonic() - started)
    except Exception as e:  # noqa: BLE001 - one clear line, not a JVM trace
        if isinstance(e, (neardup.NeardupError, OSError, ValueError)) or "NeardupError" in str(e) or "AnalysisException" in type(e).__name__:
            return fail(_error_message(e))
        raise
    _log(quiet, f"write: {args.output} in {result.stages['write']:.1f} s ({', '.join(f'{k} {v:.1f} s' for k, v in took.items())})")
    total = time.monotonic() - started
    stages = ", ".join(f"{k} {v:.1f} s" for k, v in result.stages.items())
    if not quiet:
        print(f"neardup.spark: done in {total:.1f} s ({stages}); output in {args.output}", file=sys.stderr)
    return 0
