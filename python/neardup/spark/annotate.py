"""Annotations (``--annotate``): every record with ``cluster``,
``duplicate_of`` and ``similarity``, as ``neardup dedup --annotate`` writes
them (driver path only).

Reads the verified pairs and clusters on the driver and the input once
more. Broadcasts the annotations of the documents with a pair (position,
cluster id, whether moved, best similarity); shuffles nothing. Sets
``result.annotated`` (and its local writer): JSON Lines records with the
three fields appended by core's ``record::annotate``, or rows with three
columns added.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

import neardup
from neardup import _neardup as _rs

from .arrow import _text_buffers
from .job import Job
from .result import SparkDedupResult
from .writing import _write_lines_local


def annotations(spark: Any, job: Job, result: SparkDedupResult, records: Any, names: Any, reps: Any, kept: Any,
                scores: Any, first_new: int, bad_pos: Any) -> None:
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

    splits, bits, json_col, id_col, field, weighted = job.splits, job.bits, job.json_col, job.id_col, job.field, job.weighted
    meta, pos_of, place_of = job.meta, job.positions, job.place_of
    pos, id_of, json_of = names.pos, names.id_of, names.json_of
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
