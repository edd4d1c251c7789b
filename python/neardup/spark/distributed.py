"""The distributed path (the default; the driver joins only when asked to,
up to ``driver_documents``, or for what only it does): stages 2 to
5 in the executors, the driver holding only what does not grow with the
corpus (the centre, the hot keys, counts).

Reads the fingerprint pass's rows and, for the exact check and the kept
records, the input again. Shuffles: the rows centred on the corpus (sums
per partition, added on the driver and broadcast back); each document k + 1
times keyed by block for the candidates (:func:`.candidates._candidates`;
with ``against``, the new documents only, the existing set looked up
without a shuffle, :func:`.candidates._batch_pairs`); unless the join's
tasks checked them with the feature sets the fingerprint pass kept, the
undecided pairs by connected component, and their documents' texts unless
the executors read them at their byte offsets
(:func:`.verify._verify_distributed`); the
verified pairs for the components (:func:`.components._components`); the
clustered documents' ids to name the outputs, and the removed positions by
byte range for the kept records. Returns the result's DataFrames
(:func:`run`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional

import neardup

from .candidates import _batch_pairs, _candidates, _centre_distributed
from .components import _components, _keepers
from .job import Job
from .outputs import _named_outputs, kept_distributed, named_lines_local
from .report import _log, _log_shuffles
from .result import SparkDedupResult
from .verify import _features_at, _verify_distributed

# Documents per partition of the distributed path's joins (ids, clusters),
# when the session does not set spark.sql.shuffle.partitions.
DOCUMENTS_PER_PARTITION = 200_000


@dataclass
class Inputs:
    """What the distributed stages read besides the fingerprint pass's rows."""

    #: The new records numbered as the fingerprint pass numbered them, with
    #: only the data columns (for the kept records when Spark reads them).
    numbered: Any
    #: Every document's text (``_pos`` and the body), for the exact check.
    texts: Any
    #: With documents already clean (``against``), the first position of a
    #: new one (the old ones come first), else None; and the new documents.
    first_new: Optional[int]
    n_new: int
    #: The positions of the records skipped as invalid, or None.
    bad: Any


def run(spark: Any, job: Job, records: Any, fps: Any, stages: dict, report: Any) -> SparkDedupResult:
    """Stages 2 to 5 of ``fps`` (the fingerprint pass's rows and counts),
    refusing what the path cannot do (another policy, an IDF table,
    weighted features, annotations)."""
    n = fps.n
    limit = job.driver_limit
    if job.driver_only:
        raise neardup.NeardupError(
            f"{n:,} documents are more than the driver joins ({limit:,}): the distributed path "
            "takes texts with policy components, no IDF table and no annotate (or "
            "raise driver_documents, about 175 bytes of driver memory per document)"
        )
    _log(job.quiet, f"{n:,} documents: the executors join them" if job.driver_documents is None else
         f"{n:,} documents are more than the driver joins ({limit:,}): the executors join them")
    inputs = _inputs(job, records, fps)
    cores = spark.sparkContext.defaultParallelism
    if not spark.sparkContext.getConf().contains("spark.sql.shuffle.partitions"):
        # The joins' shuffles (Spark's default of 200 partitions is too many
        # on a few cores, too few at billions of documents), unless set.
        spark.conf.set("spark.sql.shuffle.partitions", str(max(4 * cores, -(-n // DOCUMENTS_PER_PARTITION))))
    rows, kept, undecided, n_und, n_kept = candidates(spark, job, fps.rows, fps.centre, n, inputs, stages, report)
    edges, n_edges = verify(spark, job, rows, n, kept, undecided, n_und, inputs, stages, report, n_kept)
    reps, dropped, edges = components(spark, job, rows, n, edges, n_edges, inputs, stages, report)
    _log_shuffles(report, job.quiet)
    return outputs(spark, job, rows, edges, reps, dropped, inputs, stages, report, fps.string_ids, n_edges)


def _inputs(job: Job, records: Any, fps: Any) -> Inputs:
    """The records numbered in input order, the texts the exact check reads,
    and where the new documents start."""
    import pyarrow as pa
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    json_col, meta, body, pos_of, kinds = job.json_col, job.meta, job.body, job.positions, fps.kinds
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
    bad = fps.every.where(F.col("_bad")).select("_pos") if fps.skipped else None
    return Inputs(numbered, texts, first_new, new[0] if new is not None else 0, bad)


def candidates(spark: Any, job: Job, rows: Any, centre_sums: Optional[bytes], n: int, inputs: Inputs, stages: dict,
               report: Any) -> tuple:
    """Stage 2: the rows centred on the corpus (when the job centres), and
    the candidate pairs: (rows, kept, undecided, the undecided pairs'
    count, the kept pairs' count when the join's tasks counted them, else
    None), the pairs as DataFrames of (``pa``, ``pb``, ``distance``,
    ``score``). With ``against``, the new
    documents are joined among themselves by :func:`._candidates` and with
    the old ones by :func:`._batch_pairs` (the existing set read, never
    shuffled)."""
    from pyspark.sql import functions as F

    bits, k, threshold, quiet, first_new = job.bits, job.k, job.threshold, job.quiet, inputs.first_new
    t1 = time.monotonic()
    centre = spark.sparkContext.broadcast(centre_sums) if job.centred else None
    if centre is not None and first_new is not None:
        # The batch mode's lookups and later rounds read the centred rows;
        # the join alone decides each fingerprint as it reads it.
        rows, centre = _centre_distributed(rows, centre, bits), None
    # A crowd of near copies in one group is checked there (texts read at
    # their byte offsets, when the executors read the input).
    features_at = _features_at(spark, job.splits, job.rows_of, job.spill) if job.splits is not None and not job.pairs else None
    tally = None
    # The join's tasks read their documents' summaries there too: the rows
    # cross the shuffle without them.
    kept_summaries = job.spill.summaries_at if job.spill is not None else None
    if first_new is None:
        # With the fingerprint pass's feature sets at hand, each task of the
        # join checks its own undecided pairs.
        kept_sets = job.spill.sets_at if job.spill is not None and job.pairs else None
        kept, undecided, tally = _candidates(spark, rows, n, bits, k, threshold, job.max_group, quiet, spanning=not job.pairs,
                                             features_at=features_at, centre=centre, kept_sets=kept_sets,
                                             kept_summaries=kept_summaries)
    else:
        new_fps, old_fps = rows.where(F.col("_pos") >= first_new), rows.where(F.col("_pos") < first_new)
        kept, undecided, _ = _candidates(spark, new_fps, inputs.n_new, bits, k, threshold, job.max_group, quiet,
                                         spanning=not job.pairs, features_at=features_at, kept_summaries=kept_summaries)
        tb = time.monotonic()
        batch_kept, batch_und = _batch_pairs(spark, old_fps, new_fps, bits, k, threshold)
        _log(quiet, f"against: {n - inputs.n_new:,} old documents looked up in the {inputs.n_new:,} new ones: "
             f"{batch_kept.count() + batch_und.count():,} pairs within k = {k} in {time.monotonic() - tb:.1f} s")
        kept, undecided = kept.unionByName(batch_kept), undecided.unionByName(batch_und)
    if tally is not None:
        # Counted by the join's tasks, which left nothing undecided.
        (total, measured, n_kept), n_und = tally, 0
        said = f", {measured:,} checked exactly by the same tasks"
    else:
        # Both counted in one job.
        counted = kept.select(F.lit(0).alias("u")).unionByName(undecided.select(F.lit(1).alias("u"))).agg(F.count("*"), F.sum("u"))
        total, n_und = counted.collect()[0]
        n_und = measured = n_und or 0
        n_kept = None
        said = f", {n_und:,} left to the exact check" if threshold is not None else ""
    stages["candidates"] = time.monotonic() - t1
    report.done("candidates", stages["candidates"], n, pairs=total, undecided=measured)
    _log(quiet, f"candidates: {total:,} pairs within k = {k}{said} in {stages['candidates']:.1f} s")
    return rows, kept, undecided, n_und, n_kept


# Pairs a partition of the verified pairs holds (at least two partitions a
# core).
EDGES_PER_PARTITION = 1_000_000


def verify(spark: Any, job: Job, rows: Any, n: int, kept: Any, undecided: Any, n_und: int, inputs: Inputs,
           stages: dict, report: Any, n_kept: Optional[int] = None) -> tuple:
    """Stage 3: the undecided pairs checked exactly (:func:`._verify_distributed`),
    and with ``against`` the pairs of old documents the new ones reach
    (:func:`_old_links`). Returns the verified pairs and their count
    (``n_kept``, the kept pairs' count, when nothing is left to check and the
    join's tasks counted them; else counted here)."""
    from pyspark.sql import functions as F

    threshold, first_new = job.threshold, inputs.first_new

    def checked(und, count):
        return _verify_distributed(spark, und, count, threshold, job.rows_of, job.splits, inputs.texts, job.spill)

    t2 = time.monotonic()
    edges = kept
    if n_und:
        # The exact check's many small tasks, kept as a few partitions: the
        # stages after it run a task per partition.
        cores = spark.sparkContext.defaultParallelism
        parts = max(2 * cores, -(-n_und // EDGES_PER_PARTITION))
        edges = kept.unionByName(checked(undecided, n_und)).coalesce(parts).localCheckpoint()
    if first_new is not None:
        old_fps = rows.where(F.col("_pos") < first_new)
        edges = _old_links(spark, edges, old_fps, first_new, bits=job.bits, k=job.k, threshold=threshold, quiet=job.quiet,
                           verify=checked)
    stages["verify"] = time.monotonic() - t2
    # Set only by the join's tasks' tally, which leaves nothing undecided.
    n_edges = n_kept if n_kept is not None else edges.count()
    report.done("verify", stages["verify"], n, verified=n_edges)
    if threshold is not None:
        _log(job.quiet, f"verify: {n_edges:,} pairs at Jaccard >= {threshold} in {stages['verify']:.1f} s")
    return edges, n_edges


def components(spark: Any, job: Job, rows: Any, n: int, edges: Any, n_edges: int, inputs: Inputs, stages: dict,
               report: Any) -> tuple:
    """Stage 4: each clustered document's representative (``_pos``, ``rep``;
    by keep-by, ``against``'s documents preferred), the removed positions
    (skipped records' included) and the pairs to report (with ``against``,
    only those with a new document)."""
    from pyspark.sql import functions as F

    first_new = inputs.first_new
    t3 = time.monotonic()
    reps = _components(spark, edges.select(F.col("pa").alias("a"), F.col("pb").alias("b")), count=n_edges)
    if job.rule is not None:
        reps = _keepers(reps, rows, job.rule, first_new)
    removed = F.col("_pos") != F.col("rep")
    if first_new is not None:
        # Old documents are never removed; only clusters with a new member
        # are reported, and only pairs with a new document.
        removed &= F.col("_pos") >= first_new
        reps = reps.join(reps.where(F.col("_pos") >= first_new).select("rep").distinct(), "rep", "left_semi")
        edges = edges.where(F.col("pb") >= first_new)
    dropped = reps.where(removed).select("_pos").localCheckpoint()
    n_dropped = dropped.count()
    if inputs.bad is not None:
        dropped = dropped.union(inputs.bad)  # skipped records are not kept either
    stages["components"] = time.monotonic() - t3
    report.done("components", stages["components"], n, removed=n_dropped)
    _log(job.quiet, f"components: {n_dropped:,} documents removed in {stages['components']:.1f} s")
    return reps, dropped, edges


def outputs(spark: Any, job: Job, rows: Any, edges: Any, reps: Any, dropped: Any, inputs: Inputs, stages: dict,
            report: Any, string_ids: bool, n_edges: int) -> SparkDedupResult:
    """Stage 5: the pairs and clusters named by ids (JSON Lines records' ids
    read as integers when every one is, else as strings) and the kept
    records, as DataFrames."""
    from pyspark.sql import functions as F

    ids = rows.select("_pos", "_id")
    if job.json_col is not None:
        # Ids as the records hold them: integers if every one is, else
        # strings (the fingerprint pass's tally says which).
        ints = not string_ids
        wrapped = F.concat(F.lit('{"v":'), F.col("_id"), F.lit("}"))
        ids = ids.select("_pos", F.from_json(wrapped, "v long" if ints else "v string").getField("v").alias("_id"))
    out_pairs, clusters = _named_outputs(edges if job.pairs else None, reps, ids,
                                         [F.col("score").alias("jaccard")] if job.threshold is not None else [])
    result = SparkDedupResult(out_pairs, clusters, None, stages, job.json_col is not None, report=report)
    result.deduped, result.write_local = kept_distributed(spark, job, inputs.numbered, dropped)
    if job.spill is not None and job.json_col is not None:
        # The JSON Lines outputs named with the ids the fingerprint pass kept.
        result.write_pairs_local, result.write_clusters_local = named_lines_local(
            spark, job.spill, string_ids, edges if job.pairs else None, reps, n_edges, report.documents)
    return result


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
