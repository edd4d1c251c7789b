"""Stage 3, the exact check: the pairs the summaries could not decide,
measured in Rust over their documents' feature sets, in the executors.

On the driver path (:func:`_exact_check`, :func:`_exact_check_direct`):
the undecided pairs are routed into buckets on the driver (:func:`_buckets`,
a connected group of pairs one bucket) and the plan broadcast; each task
reads its documents' feature sets from the fingerprint pass's spill folder
(:mod:`.spill`), else reads the documents again at their byte offsets (no
shuffle of texts), else a pass over the input sends only those documents,
each to the buckets of its pairs (a shuffle of their texts). On the
distributed path (:func:`_verify_distributed`): the pairs are shuffled by
connected component to tasks of about EXACT_PAIRS_PER_TASK, each reading
its documents' sets (spill) or texts (byte offsets), or receiving the
texts by a shuffle. Returns the pairs at or above the threshold, with
their exact scores.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import neardup
from neardup import _neardup as _rs

from .arrow import _local, _scored_pair_schema, _to_arrow
from .components import _components, _union_find
from .read import read_lines_at


# Undecided pairs checked by one task of the distributed exact check (their
# documents' texts and feature sets are held at once), and the most
# documents of one connected group of them sent to one task whole.
EXACT_PAIRS_PER_TASK = 20_000


# The same when the documents' feature sets come from the spill folder (a
# task then holds their sets alone: 2.7 KB a document in the 4 GB corpus,
# where 100,000 pairs named about 7,700 documents): each task is a call of
# its Python worker, and at 4 GB 199 tasks of 20,000 spent 23 core-seconds
# where 40 of 100,000 spent 14.
EXACT_SPILLED_PAIRS_PER_TASK = 50_000


EXACT_DOCS_PER_TASK = 20_000


# Undecided pairs whose buckets one task finds (its union-find and the
# pairs in and out of it take about a second at this count; 4 million took
# 6.7 s, longer than the components' parallel jobs).
ONE_TASK_BUCKETS = 1_000_000


def _features_of(rows_of: Any, batch: Any, need: Any) -> list:
    """The feature sets (sorted u64 hashes as bytes) of the records of
    ``batch``, at positions ``need``."""
    r, rows = rows_of(batch, need, False, True, fingerprints=False)
    if len(rows) != len(need):
        raise neardup.NeardupError("the input changed while the job ran: a document to check is no longer where it was read")
    return r["features"]


def _pair_columns(batches: Any) -> Any:
    """A task's pairs (``pa``, ``pb``, ``distance``) as numpy arrays, or None
    when it has none."""
    import pyarrow as pa

    got = [b for b in batches if b.num_rows]
    if not got:
        return None
    t = pa.Table.from_batches(got)
    return tuple(t.column(c).to_numpy() for c in ("pa", "pb", "distance"))


def _sets_reader(spark: Any, splits: Any, rows_of: Any, spill: Any) -> Any:
    """A function, run in the executors, of positions (ascending, distinct)
    to their documents' feature sets, one each: those the fingerprint pass
    kept (``spill``), else the documents read at their byte offsets (one
    read per document) and cut again."""
    if spill is not None:
        return spill.sets_at
    paths = spark.sparkContext.broadcast(splits.paths())

    def read(need):
        return _features_of(rows_of, read_lines_at(paths.value, need), need)

    return read


def _features_at(spark: Any, splits: Any, rows_of: Any, spill: Any = None) -> Any:
    """A function of positions to their documents' feature sets, one each
    (:func:`_sets_reader`)."""
    sets_of = _sets_reader(spark, splits, rows_of, spill)

    def at(positions):
        need, back = np.unique(positions, return_inverse=True)
        sets = sets_of(need)
        return [sets[i] for i in back]

    return at


def _verify_distributed(spark: Any, undecided: Any, count: int, threshold: float, rows_of: Any, splits: Any,
                        texts: Any, spill: Any = None) -> Any:
    """The exact check of the undecided pairs, in the executors.

    Reads the undecided (``pa``, ``pb``, ``distance``) pairs, sent by
    connected component (:func:`_components`) to tasks of about
    EXACT_PAIRS_PER_TASK pairs (EXACT_SPILLED_PAIRS_PER_TASK when the sets
    come from the spill folder ``spill``). When the executors
    read the input themselves (``splits``), each task reads its pairs'
    documents at their byte offsets: no text is shuffled. Otherwise each
    document is shuffled once to each task holding one of its pairs
    (``texts(fn, schema)`` maps the input's batches). Returns the pairs at
    or above the threshold, with their exact ``score``."""
    import pyarrow as pa
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    cores = spark.sparkContext.defaultParallelism
    parts = max(cores, -(-count // (EXACT_PAIRS_PER_TASK if spill is None else EXACT_SPILLED_PAIRS_PER_TASK)))
    # Pairs of one connected component go to one task, so that each
    # document is read once; a component of more than EXACT_DOCS_PER_TASK
    # documents is spread by its pairs' first documents.
    if count <= ONE_TASK_BUCKETS:
        # Few enough for one task: it finds the components and names each
        # pair's bucket (one job, not the components' and two joins).
        bucket_schema = T.StructType(undecided.select("pa", "pb", "distance").schema.fields + [T.StructField("bucket", T.LongType(), False)])

        def bucketed(batches):
            pairs = _pair_columns(batches)
            if pairs is None:
                return
            a, b, d = pairs
            nodes, reps = _union_find(a, b)
            roots, size = np.unique(reps, return_counts=True)
            rep = reps[np.searchsorted(nodes, a)]
            large = size[np.searchsorted(roots, rep)] > EXACT_DOCS_PER_TASK
            yield pa.RecordBatch.from_arrays([pa.array(a), pa.array(b), pa.array(d), pa.array(np.where(large, a, rep))],
                                             names=bucket_schema.fieldNames())

        undecided = undecided.select("pa", "pb", "distance").coalesce(1).mapInArrow(bucketed, bucket_schema)
    else:
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
        sets_of = _sets_reader(spark, splits, rows_of, spill)

        def check(batches):
            pairs = _pair_columns(batches)
            if pairs is None:
                return
            a, b, d = pairs
            need = np.unique(np.concatenate([a, b]))
            yield measured(a, b, d, need, sets_of(need))

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


def _exact_check_direct(spark, splits, rows_of, pos, undecided, threshold, kept, scores, spill=None):
    """:func:`_exact_check` where the executors read the input themselves
    (:class:`LocalSplits`): each task reads its buckets' documents at their
    byte offsets, with no pass over the whole input and no shuffle of texts."""
    from pyspark.sql import types as T

    plan = _buckets(undecided)
    docs, buckets = plan.pop("docs"), plan["buckets"]
    plan["held"] = pos[docs]
    del plan["route_doc"], plan["route_bucket"]
    shared = spark.sparkContext.broadcast(plan)
    sets_of = _sets_reader(spark, splits, rows_of, spill)
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
                # Feature sets in `need`'s order.
                sets = [None] * len(need)
                for at, s in zip(order, sets_of(held[order])):
                    sets[at] = s
                a = np.searchsorted(need, i).astype(np.uint32)
                c = np.searchsorted(need, j).astype(np.uint32)
                js = np.array(_rs.exact_indexed(sets, a.tobytes(), c.tobytes(), t))
                yield _scored(i, j, p["d"][sel], js, t)

    frame = spark.createDataFrame(tasks, T.StructType([T.StructField("bucket", T.LongType(), False)]))
    exact = _to_arrow(frame.mapInArrow(check, _scored_schema()))
    shared.unpersist()
    return _with_scored(exact, docs, kept, scores)
