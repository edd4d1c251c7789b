"""Stage 5, outputs: the pairs and clusters named by the records' ids, and
the records kept.

Reads the verified pairs and each document's cluster (numpy arrays on the
driver, :func:`named_on_driver`; DataFrames on the distributed path,
:func:`_named_outputs`) and the fingerprint pass's ids. On the driver
path only the ids the outputs name are collected (a broadcast semi-join);
on the distributed path the pairs and clusters are joined with the ids
(shuffles of the clustered documents only). The kept records come from one
more pass over the input, unchanged (JSON Lines lines or Parquet rows),
minus the removed positions: a broadcast of them from the driver, or on the
distributed path grouped by the byte range holding each (a shuffle of the
removed positions only). Returns DataFrames, written by
:func:`neardup.spark.write`.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import numpy as np

from .arrow import _frame, _local, _to_arrow
from .files import write_pieces
from .job import Job
from .read import _POS_SHIFT, _read_range, _without_newlines
from .tasks import task_count
from .writing import _write_lines_local

# Blank lines are not records (as `neardup dedup` reads them).
_BLANK = "^[ \\t\\n\\r\\f]*$"


def _named_outputs(pairs: Any, reps: Any, ids: Any, scores: list) -> tuple:
    """The distributed paths' outputs named by ids (``ids``: ``_pos``,
    ``_id``): the pairs (``pa``, ``pb``, ``distance`` and the columns
    ``scores``) as ``a``, ``b``, ``distance``, ... in input order, or None
    without pairs; and the clusters of ``reps`` (``_pos``, ``rep``) as
    ``representative``, ``size`` and ``members`` (in input order)."""
    from pyspark.sql import functions as F

    # Every clustered document named once (a cluster's representative and
    # each pair's two documents are among them), kept for both outputs.
    # Cached, not checkpointed: with adaptive execution even a lazy
    # checkpoint runs its shuffles at once, and these frames are computed
    # only if written (the JSON Lines writers from the spill folder do not
    # read them).
    members = reps.join(ids, "_pos").cache()
    out_pairs = None
    if pairs is not None:
        out_pairs = (
            pairs.join(members.select(F.col("_pos").alias("pa"), F.col("_id").alias("a")), "pa")
            .join(members.select(F.col("_pos").alias("pb"), F.col("_id").alias("b")), "pb")
            # Kept for the sort, whose sampling pass would join them again.
            .cache()
            .orderBy("pa", "pb")
            .select("a", "b", "distance", *scores)
        )
    clusters = (
        members.groupBy("rep")
        .agg(F.count("*").alias("size"), F.sort_array(F.collect_list(F.struct("_pos", "_id"))).alias("m"),
             F.first(F.when(F.col("_pos") == F.col("rep"), F.col("_id")), ignorenulls=True).alias("representative"))
        .cache()
        .orderBy("rep")
        .select("representative", "size", F.col("m._id").alias("members"))
    )
    return out_pairs, clusters


def _json_values(ids: Any, string_ids: bool) -> Any:
    """Ids' JSON text as the outputs write them: as they are, but an
    integer id quoted when some ids are strings (the outputs then name
    every document by a string)."""
    import pyarrow.compute as pc

    if not string_ids:
        return ids
    quoted = pc.starts_with(ids, '"')
    return pc.if_else(quoted, ids, pc.binary_join_element_wise('"', ids, '"', ""))


def _double_text(values: Any) -> Any:
    """Doubles as JSON numbers, a whole one with ".0" as Spark writes it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    text = values.cast(pa.string())
    plain = pc.match_substring_regex(text, "^-?[0-9]+$")
    return pc.if_else(plain, pc.binary_join_element_wise(text, ".0", ""), text)


def _lines(parts: list) -> Any:
    """JSON Lines of string arrays and literal texts ``parts`` (each line
    their concatenation), as one buffer."""
    import pyarrow as pa
    import pyarrow.compute as pc

    joined = pc.binary_join_element_wise(*parts, "\n", "").cast(pa.large_string())
    if isinstance(joined, pa.ChunkedArray):
        joined = joined.combine_chunks()
    offs = np.frombuffer(joined.buffers()[1], dtype="<i8")[joined.offset : joined.offset + len(joined) + 1]
    return memoryview(joined.buffers()[2])[offs[0] : offs[-1]] if len(joined) else b""


def named_lines_local(spark: Any, spill: Any, string_ids: bool, pairs: Any, reps: Any, n_pairs: int, n: int) -> tuple:
    """Writers of the pairs and clusters as JSON Lines, the lines :func:`write`
    would write from :func:`_named_outputs`' DataFrames, named with the ids
    the fingerprint pass kept (:meth:`~.spill.Spill.ids_at`) and written by
    the executors' Python workers into a local (or shared) folder: no join,
    no sort and no JSON writer in the JVM. The pairs and the clustered
    documents are range-partitioned by position (a shuffle of 32 and 16
    bytes a row), each task sorts its rows, names them and writes one part.
    Each writer takes the folder and returns False, writing nothing, when
    the spill is gone."""
    import os
    import uuid

    import pyarrow as pa
    import pyarrow.compute as pc

    from .writing import _into_folder

    cores = spark.sparkContext.defaultParallelism

    def ids_of(pos):
        need, back = np.unique(pos, return_inverse=True)
        return _json_values(spill.ids_at(need), string_ids).take(pa.array(back))

    def whole(batches):
        got = [b for b in batches if b.num_rows]
        return pa.Table.from_batches(got).combine_chunks() if got else None

    def written(frame, fn, folder):
        from pyspark import TaskContext
        from pyspark.sql import types as T

        schema = T.StructType([T.StructField("rows", T.LongType(), False)])

        def run(tmp):
            def parts(batches):
                t = whole(batches)
                rows = 0
                if t is not None:
                    name = os.path.join(tmp, f"part-{TaskContext.get().partitionId():05d}.json")
                    part = f"{name}.{uuid.uuid4().hex}"
                    with open(part, "wb") as f:
                        rows = fn(t, f)
                    os.replace(part, name)
                yield pa.RecordBatch.from_arrays([pa.array([rows], pa.int64())], names=["rows"])

            frame.mapInArrow(parts, schema).collect()

        if not os.path.isdir(spill.folder):
            return False
        _into_folder(folder, run)
        return True

    def pair_lines(t, f):
        a, b = t.column("pa").to_numpy(), t.column("pb").to_numpy()
        order = np.lexsort((b, a))
        m = len(order)
        ids = ids_of(np.concatenate([a[order], b[order]]))
        take = pa.array(order)
        write_pieces(f, _lines(['{"a":', ids.slice(0, m), ',"b":', ids.slice(m), ',"distance":',
                        t.column("distance").take(take).cast(pa.string()), ',"jaccard":',
                        _double_text(t.column("score").take(take)), "}"]))
        return m

    def cluster_lines(t, f):
        pos, rep = t.column("_pos").to_numpy(), t.column("rep").to_numpy()
        order = np.lexsort((pos, rep))
        pos, rep = pos[order], rep[order]
        starts = np.flatnonzero(np.r_[True, rep[1:] != rep[:-1]])
        members = pa.ListArray.from_arrays(pa.array(np.r_[starts, len(rep)].astype(np.int32)), ids_of(pos))
        write_pieces(f, _lines(['{"representative":', ids_of(rep[starts]), ',"size":',
                        pa.array(np.diff(np.r_[starts, len(rep)])).cast(pa.string()), ',"members":[',
                        pc.binary_join(members, ","), "]}"]))
        return len(starts)

    pair_parts = task_count(cores, -(-n_pairs // 1_000_000))
    cluster_parts = task_count(cores, -(-n // 1_000_000))
    sorted_pairs = pairs.select("pa", "pb", "distance", "score").repartitionByRange(pair_parts, "pa", "pb") if pairs is not None else None

    def write_pairs(folder):
        return written(sorted_pairs, pair_lines, folder)

    sorted_reps = reps.select("_pos", "rep").repartitionByRange(cluster_parts, "rep")

    def write_clusters(folder):
        return written(sorted_reps, cluster_lines, folder)

    return write_pairs if pairs is not None else None, write_clusters


class Names:
    """The ids of the documents the outputs name, fetched to the driver
    (only these): ``pos`` are the documents' positions (document i at
    ``pos[i]``)."""

    def __init__(self, spark: Any, job: Job, rows: Any, pos: Any, named: Any):
        import pyarrow as pa
        from pyspark.sql import functions as F

        id_rows = _to_arrow(rows.select("_pos", "_id").join(F.broadcast(_local(spark, {"_pos": pos[named]})), "_pos", "left_semi"))
        id_pos = id_rows.column("_pos").to_numpy()
        by_pos = np.argsort(id_pos)
        self.pos = pos
        self.id_pos = id_pos[by_pos]
        values = id_rows.column("_id").take(pa.array(by_pos)).combine_chunks()
        #: The JSON text of each id, for JSON Lines records.
        self.texts = values
        if job.json_col is not None:
            # Ids as the records hold them: integers if every one is, else strings.
            texts = values.to_pylist()
            parsed = [json.loads(x) for x in texts]
            ints = all(not x.startswith('"') for x in texts)
            values = pa.array(parsed, type=pa.int64()) if ints else pa.array([str(v) for v in parsed], type=pa.string())
        self.values = values

    def id_of(self, docs: Any) -> Any:
        """The ids of documents ``docs``, an Arrow array."""
        import pyarrow as pa

        return self.values.take(pa.array(np.searchsorted(self.id_pos, self.pos[docs])))

    def json_of(self, docs: Any) -> Any:
        """The ids of documents ``docs`` as the JSON Lines records write them."""
        import pyarrow as pa

        return self.texts.take(pa.array(np.searchsorted(self.id_pos, self.pos[docs])))


def named_on_driver(spark: Any, job: Job, rows: Any, pos: Any, n_old: int, reps: Any, moved: Any, kept: Any,
                    scores: Any) -> tuple:
    """The driver path's pairs (None without pairs) and clusters as
    DataFrames named by ids, and the :class:`Names` they used. Pairs of two
    old documents are not reported, nor clusters without a new member."""
    import pyarrow as pa

    n = len(reps)
    in_cluster = np.unique(np.concatenate([moved, reps[moved]]))
    first_new = n_old
    # Pairs of two old documents are not reported; without pairs, none are.
    keep_pairs = (kept[:, 1] >= first_new) & job.pairs
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
    names = Names(spark, job, rows, pos, named)
    id_of = names.id_of

    pair_cols = {"a": id_of(pairs_ab[:, 0]), "b": id_of(pairs_ab[:, 1]), "distance": pa.array(pairs_ab[:, 2])}
    if job.threshold is not None:
        pair_cols["jaccard"] = pa.array(pair_scores)
    out_pairs = _frame(spark, pa.table(pair_cols)) if job.pairs else None
    starts = np.flatnonzero(np.r_[True, reps[members][1:] != reps[members][:-1]]) if len(members) else np.array([], dtype=np.int64)
    offsets = np.r_[starts, len(members)].astype(np.int32)
    clusters = _frame(spark, pa.table({
        "representative": id_of(reps[members[starts]]) if len(members) else names.values.slice(0, 0),
        "size": pa.array(np.diff(offsets).astype(np.int64)),
        "members": pa.ListArray.from_arrays(pa.array(offsets), id_of(members)),
    }))
    return out_pairs, clusters, names


def kept_on_driver(spark: Any, job: Job, records: Any, gone: Any) -> tuple:
    """The new records not at positions ``gone`` (removed, or skipped as
    invalid; a numpy array from the driver), in input order, unchanged, and
    their local writer (None unless the executors read the input)."""
    import pyarrow as pa
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    json_col, splits, pos_of, blank = job.json_col, job.splits, job.positions, _BLANK
    survivors = records.where(F.col("_new"))
    if splits is not None:
        # Read, filtered and cut into lines by the executors; only the kept
        # lines go to Spark's writer.
        gone_b = spark.sparkContext.broadcast(np.sort(gone))
        keep_schema = T.StructType([T.StructField("value", T.StringType(), True)])

        def kept(b):
            import pyarrow.compute as pc

            keep = b.column("_new").to_numpy(zero_copy_only=False) & ~np.isin(b.column("_pos").to_numpy(), gone_b.value)
            keep &= ~pc.match_substring_regex(b.column("value"), blank).to_numpy(zero_copy_only=False)
            return b.column("value").filter(pa.array(keep)) if keep.any() else None

        def kept_lines(batches):
            for b in batches:
                lines = kept(b)
                if lines is not None:
                    yield pa.RecordBatch.from_arrays([_without_newlines(lines)], names=["value"])

        return splits.map(spark, kept_lines, keep_schema), functools.partial(_write_lines_local, spark, splits, None, removed=gone_b)
    if job.meta == ["_pos"]:
        if json_col is not None:
            survivors = survivors.where(~F.col(json_col).rlike(blank))
        survivors = survivors.join(F.broadcast(_local(spark, {"_pos": gone})), "_pos", "left_anti")
        return (survivors.select(json_col) if json_col else survivors.drop("_pos", "_new")), None
    # Numbered and filtered in one pass, the records unchanged.
    gone_b = spark.sparkContext.broadcast(np.sort(gone))
    data = [json_col] if json_col else [c for c in records.columns if c not in ("_file", "_start", "_row", "_new")]
    keep_schema = T.StructType([records.schema[c] for c in data])

    def keep_batches(batches):
        state = {}
        import pyarrow.compute as pc

        for b in batches:
            keep = ~np.isin(pos_of(b, state), gone_b.value)
            if json_col is not None:
                keep &= ~pc.match_substring_regex(b.column(json_col), blank).to_numpy(zero_copy_only=False)
            yield pa.RecordBatch.from_arrays([b.column(c).filter(pa.array(keep)) for c in data], names=data)

    return survivors.mapInArrow(keep_batches, keep_schema), None


def kept_distributed(spark: Any, job: Job, numbered: Any, dropped: Any) -> tuple:
    """The distributed path's kept records: the new records minus the
    positions of ``dropped`` (a DataFrame), in input order, unchanged, and
    their local writer (None unless the executors read the input)."""
    import pyarrow as pa
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    json_col, splits, blank = job.json_col, job.splits, _BLANK
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
        # One range a task again after the join (a sort would gather the
        # few rows into one task, and the writing onto one core).
        ranges = (splits.frame(spark).where(F.col("new")).join(gone, "index", "left")
                  .repartitionByRange(max(len(splits.ranges), 1), "index").sortWithinPartitions("index"))

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

        deduped = ranges.mapInArrow(kept_lines, T.StructType([T.StructField("value", T.StringType(), True)]))
        return deduped, functools.partial(_write_lines_local, spark, splits, None, frame=ranges)
    # Read by Spark: the records in input order, minus the removed positions
    # (a broadcast join, which keeps the order; its positions pass the driver).
    survivors = numbered.join(F.broadcast(dropped), "_pos", "left_anti")
    if json_col is not None:
        survivors = survivors.where(~F.col(json_col).rlike(blank))
    return survivors.drop("_pos"), None
