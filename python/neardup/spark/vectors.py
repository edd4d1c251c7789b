"""Dense vectors (``vector_col``): their own path, as ``neardup dedup``
takes them.

Reads the rows, numbered in input order (``zipWithIndex`` unless they
carry ``_pos``). Fingerprints them in the executors (128 bits); candidates
by :func:`.candidates._candidates` (its shuffle); exact cosine of each
candidate pair in the executors (a shuffle joining each pair with its two
vectors); components by :func:`.components._components`. Returns the
pairs, clusters and kept rows as DataFrames (components policy, keep-by
first).
"""

from __future__ import annotations

import time
from typing import Any, Optional

import numpy as np

import neardup
from neardup import _neardup as _rs

from .arrow import _arrow_type
from .candidates import MAX_GROUP, _candidates
from .components import _components
from .outputs import _named_outputs
from .result import SparkDedupResult


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
    pairs, _, _ = _candidates(spark, fps.select("_pos", "fp_hi", "fp_lo"), n, bits, k, None, max_group, True)
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
