"""Corpus-scale dedup on Apache Spark, with the same answers as ``neardup dedup``.

Command line::

    python -m neardup.spark dedup --input corpus.jsonl --output out/ [--format parquet|jsonl]

From your own PySpark code::

    from neardup.spark import dedup
    result = dedup(spark, df, id_col="id", text_col="text")
    result.pairs, result.clusters, result.deduped      # DataFrames

How it runs (each step distributed):

1. Fingerprints in the executors with the Rust core, through ``mapInArrow``
   (and, with verification, each document's exact feature set).
2. One key per table of the join design: the fingerprint's permuted prefix
   (paper section 3.1). Rows are shuffled by key and each key group is
   compared in Rust; a pair is reported only by the first table whose prefix
   both share, so each pair comes out once.
3. Skew: a key group larger than ``max_group`` (a giant cluster of copies) is
   split into blocks of ``max_group`` rows; each pair of blocks is its own
   group, so no task compares more than ``max_group``² pairs. A group of m
   rows becomes ceil(m / max_group)² / 2 tasks and each row is copied
   ceil(m / max_group) times.
4. Verification (default, as ``neardup dedup``): each candidate pair is joined
   with both documents' feature sets and kept when their Jaccard similarity
   reaches the threshold.
5. Clusters: connected components of the pairs by the large-star/small-star
   algorithm (Kiveris et al., SoCC 2014), iterated in Spark until nothing
   changes; each cluster is represented by its first document in input order,
   as ``neardup dedup --policy components`` does.

Outputs under ``--output DIR``: ``DIR/pairs`` (columns ``a``, ``b``,
``distance``, and ``jaccard`` when verified), ``DIR/clusters``
(``representative``, ``size``, ``members``) and ``DIR/deduped`` (the
surviving input records, unchanged), Parquet by default or JSON Lines.
Input order is the order Spark reads (one file: its line order).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

import neardup
from neardup import _neardup as _rs


@dataclass
class SparkDedupResult:
    """DataFrames of a Spark dedup, and the wall time of each stage."""

    pairs: Any
    clusters: Any
    deduped: Any
    stages: dict


def _settings(verify: Any, k: Optional[int], config: Any, kwargs: dict):
    threshold = neardup._verify_threshold(verify)
    cfg = neardup._dedup_config(threshold is not None, config, kwargs)
    if k is None:
        k = _rs.default_k(cfg.bits, threshold is not None)
    return cfg, k, threshold


def dedup(
    spark: Any,
    df: Any,
    *,
    id_col: str = "id",
    text_col: str = "text",
    k: Optional[int] = None,
    verify: Any = True,
    config: Any = None,
    max_group: int = 4096,
    vector_col: Optional[str] = None,
    min_similarity: Optional[float] = None,
    **kwargs: Any,
) -> SparkDedupResult:
    """Near-duplicate pairs, clusters and the deduplicated records of ``df``.

    Same defaults as ``neardup dedup`` (and :func:`neardup.dedup`): verification
    at Jaccard 0.8 over candidates from 128-bit token fingerprints within
    k = 15; ``verify=False`` for fingerprints alone (k = 3 at 64 bits).
    """
    import pyarrow as pa
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if vector_col is not None:
        # Dense vectors, as ``neardup dedup`` takes them: 128 bits, k for 99%
        # recall at the cosine threshold, candidates confirmed by exact cosine.
        import math

        cos = neardup.DEFAULT_COSINE if min_similarity is None else float(min_similarity)
        cfg = neardup.vector_config(int(kwargs.pop("bits", 128)), None, int(kwargs.pop("seed", 0)))
        if kwargs:
            raise TypeError(f"vectors take bits= and seed=, not {sorted(kwargs)}")
        threshold = cos if (verify is not False and verify is not None) else None
        if k is None:
            k = _rs.vector_k(cfg.bits, cos, 0.99)[0] if threshold is not None else min(
                cfg.bits // 8, int(math.floor(cfg.bits * math.acos(cos) / math.pi + 1e-9))
            )
        text_col = vector_col
    else:
        cfg, k, threshold = _settings(verify, k, config, kwargs)
    score = "cosine" if vector_col is not None else "jaccard"
    bits = cfg.bits
    cfg_json = cfg.to_json()
    stages = {}
    t0 = time.time()

    # Input order: positions 0..n-1 in the order Spark reads.
    indexed = df.rdd.zipWithIndex().map(lambda rv: (rv[1],) + tuple(rv[0]))
    with_pos = spark.createDataFrame(indexed, T.StructType([T.StructField("_pos", T.LongType(), False)] + df.schema.fields))
    with_pos = with_pos.localCheckpoint()
    n = with_pos.count()
    design = _rs.join_design(bits, k, float(max(n, 1)))

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
            texts = b.column(text_col)
            if vector_col is not None:
                fps = neardup.fingerprint_vectors(texts, config=c)
            else:
                fps = neardup.fingerprints(texts, c)
            if bits == 128:
                hi, lo = fps[:, 0], fps[:, 1]
            else:
                hi, lo = np.zeros(len(fps), dtype=np.uint64), fps
            cols = [b.column("_pos"), pa.array(hi.view(np.int64)), pa.array(lo.view(np.int64))]
            if threshold is not None and vector_col is not None:
                rows = [blk.astype(np.float32) for blk, _ in neardup._vector_rows(texts)]
                cols.append(pa.array([r.tobytes() for blk in rows for r in blk], type=pa.binary()))
            elif threshold is not None:
                py_texts = [t if t is not None else "" for t in texts.to_pylist()]
                cols.append(pa.array(_rs.shingle_sets(c, py_texts), type=pa.binary()))
            yield pa.RecordBatch.from_arrays(cols, schema=pa.schema([(f.name, _arrow_type(f.dataType)) for f in fp_schema.fields]))

    fps = with_pos.select("_pos", text_col).mapInArrow(fingerprint_batches, fp_schema).localCheckpoint()
    fps.count()
    stages["fingerprint"] = time.time() - t0

    # One key per design table; skewed groups split into block pairs.
    t1 = time.time()
    key_schema = T.StructType(
        [T.StructField(c, T.LongType(), False) for c in ["table", "key_hi", "key_lo", "_pos", "fp_hi", "fp_lo"]]
    )

    def key_batches(batches):
        for b in batches:
            hi = b.column("fp_hi").to_numpy().view(np.uint64)
            lo = b.column("fp_lo").to_numpy().view(np.uint64)
            words = (np.stack([hi, lo], axis=1).reshape(-1) if bits == 128 else lo).astype("<u8").tobytes()
            keys = np.frombuffer(_rs.table_keys(design, words, bits), dtype="<u8").reshape(-1, 3)
            tables = len(keys) // max(len(lo), 1)
            rep = lambda col: np.repeat(col, tables)  # noqa: E731
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array(keys[:, 0].view(np.int64)),
                    pa.array(keys[:, 1].view(np.int64)),
                    pa.array(keys[:, 2].view(np.int64)),
                    pa.array(rep(b.column("_pos").to_numpy())),
                    pa.array(rep(hi).view(np.int64)),
                    pa.array(rep(lo).view(np.int64)),
                ],
                names=key_schema.fieldNames(),
            )

    keyed = fps.select("_pos", "fp_hi", "fp_lo").mapInArrow(key_batches, key_schema)
    group = ["table", "key_hi", "key_lo"]
    sizes = keyed.groupBy(*group).count().where(F.col("count") >= 2)
    # Only groups of two or more can hold a pair.
    keyed = keyed.join(sizes, group)
    blocks = F.ceil(F.col("count") / F.lit(max_group)).cast("long")
    keyed = keyed.withColumn("nblocks", blocks).withColumn(
        "block", F.when(F.col("nblocks") > 1, F.pmod(F.xxhash64("_pos"), F.col("nblocks"))).otherwise(F.lit(0)).cast("long")
    )
    # A row of block b goes to the block pairs (min(b, j), max(b, j)) for every j.
    keyed = keyed.withColumn("other", F.explode(F.sequence(F.lit(0).cast("long"), F.col("nblocks") - 1)))
    keyed = keyed.withColumn("block_i", F.least("block", "other")).withColumn("block_j", F.greatest("block", "other"))
    order = group + ["block_i", "block_j"]
    # Partitions of about two million key rows (~150 MB in the Python worker).
    tables = len(json.loads(design)["tables"])
    parts = max(spark.sparkContext.defaultParallelism * 2, -(-n * tables // 2_000_000), 1)
    sorted_rows = keyed.repartition(parts, *order).sortWithinPartitions(*order)
    pair_schema = T.StructType(
        [T.StructField("pa", T.LongType(), False), T.StructField("pb", T.LongType(), False), T.StructField("distance", T.LongType(), False)]
    )

    def pair_partitions(batches):
        tables = [b for b in batches]
        if not tables:
            return
        t = pa.Table.from_batches(tables)
        col = lambda name: t.column(name).to_numpy().astype("<i8").tobytes()  # noqa: E731
        out = np.frombuffer(
            _rs.sorted_group_pairs(
                design, bits, k,
                col("table"), col("key_hi"), col("key_lo"), col("block_i"), col("block_j"), col("block"),
                col("_pos"), col("fp_hi"), col("fp_lo"),
            ),
            dtype="<i8",
        ).reshape(-1, 3)
        yield pa.RecordBatch.from_arrays([pa.array(out[:, 0]), pa.array(out[:, 1]), pa.array(out[:, 2])], names=["pa", "pb", "distance"])

    pairs = sorted_rows.select(*order, "block", "_pos", "fp_hi", "fp_lo").mapInArrow(pair_partitions, pair_schema)
    pairs = pairs.localCheckpoint()
    pairs.count()
    stages["candidates"] = time.time() - t1

    t2 = time.time()
    if threshold is not None:
        sets = fps.select("_pos", "shingles")
        joined = (
            pairs.join(sets.withColumnRenamed("_pos", "pa").withColumnRenamed("shingles", "sa"), "pa")
            .join(sets.withColumnRenamed("_pos", "pb").withColumnRenamed("shingles", "sb"), "pb")
        )
        j_schema = T.StructType(pair_schema.fields + [T.StructField(score, T.DoubleType(), False)])
        measure = _rs.cosine_pairs if vector_col is not None else _rs.jaccard_pairs

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
    stages["verify"] = time.time() - t2

    t3 = time.time()
    reps = _components(spark, pairs.select(F.col("pa").alias("a"), F.col("pb").alias("b")))
    stages["components"] = time.time() - t3

    t4 = time.time()
    ids = with_pos.select("_pos", F.col(id_col).alias("_id"))
    out_pairs = (
        pairs.join(ids.withColumnRenamed("_pos", "pa").withColumnRenamed("_id", "a"), "pa")
        .join(ids.withColumnRenamed("_pos", "pb").withColumnRenamed("_id", "b"), "pb")
        .orderBy("pa", "pb")
        .select("a", "b", "distance", *([score] if threshold is not None else []))
    )
    members = reps.join(ids, "_pos").join(ids.withColumnRenamed("_pos", "rep").withColumnRenamed("_id", "representative"), "rep")
    clusters = (
        members.groupBy("rep", "representative")
        .agg(F.count("*").alias("size"), F.sort_array(F.collect_list(F.struct("_pos", "_id"))).alias("m"))
        .orderBy("rep")
        .select("representative", "size", F.col("m._id").alias("members"))
    )
    dropped = reps.where(F.col("_pos") != F.col("rep")).select("_pos")
    deduped = with_pos.join(dropped, "_pos", "left_anti").orderBy("_pos").drop("_pos")
    stages["outputs"] = time.time() - t4
    return SparkDedupResult(out_pairs, clusters, deduped, stages)


def _arrow_type(t: Any) -> Any:
    import pyarrow as pa
    from pyspark.sql import types as T

    return {T.LongType: pa.int64(), T.BinaryType: pa.binary(), T.DoubleType: pa.float64()}[type(t)]


def _components(spark: Any, edges: Any, max_rounds: int = 64) -> Any:
    """(_pos, rep) for every node of an edge, rep the smallest node of its
    connected component: large-star / small-star until the edges stop changing."""
    from pyspark.sql import functions as F

    e = edges.select(F.greatest("a", "b").alias("u"), F.least("a", "b").alias("v")).where("u != v").distinct().localCheckpoint()
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


def write(result: SparkDedupResult, output: str, fmt: str = "parquet") -> None:
    """Writes DIR/pairs, DIR/clusters and DIR/deduped."""
    for name, frame in [("pairs", result.pairs), ("clusters", result.clusters), ("deduped", result.deduped)]:
        w = frame.write.mode("overwrite")
        if fmt == "parquet":
            w.parquet(f"{output}/{name}")
        elif fmt == "jsonl":
            w.json(f"{output}/{name}")
        else:
            raise ValueError(f"format {fmt!r}: use parquet or jsonl")


def _session(master: Optional[str]) -> Any:
    import os

    from pyspark.sql import SparkSession

    b = SparkSession.builder.appName("neardup dedup")
    if master:
        b = b.master(master)
        if master.startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            b = b.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
            b = b.config("spark.ui.enabled", "false")
    return b.getOrCreate()


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m neardup.spark", description="Near-duplicate detection on Apache Spark.")
    sub = ap.add_subparsers(dest="command", required=True)
    d = sub.add_parser("dedup", help="pairs, clusters and deduplicated records of a corpus")
    d.add_argument("--input", required=True, nargs="+", help="JSON Lines or Parquet files or folders")
    d.add_argument("--output", required=True, help="output folder: pairs/, clusters/, deduped/")
    d.add_argument("--input-format", choices=["auto", "jsonl", "parquet"], default="auto")
    d.add_argument("--format", choices=["parquet", "jsonl"], default="parquet", help="output format")
    d.add_argument("--id-field", default="id")
    d.add_argument("--text-field", default="text")
    d.add_argument("--k", type=int)
    d.add_argument("--verify", default="jaccard:0.8", help="jaccard:T (default jaccard:0.8)")
    d.add_argument("--no-verify", action="store_true", help="decide by Hamming distance alone")
    d.add_argument("--bits", type=int, choices=[64, 128])
    d.add_argument("--features", help="tokens, shingles:W or ngrams:N")
    d.add_argument("--tokenizer", choices=["auto", "words", "jieba", "chars"])
    d.add_argument("--weights", choices=["tf", "binary"])
    d.add_argument("--max-group", type=int, default=4096, help="split key groups larger than this (skew)")
    d.add_argument("--vector-column", help="dedup dense vectors (an array of numbers) in this column instead of texts")
    d.add_argument("--min-similarity", type=float, help="with --vector-column: the cosine threshold (default 0.95)")
    d.add_argument("--seed", type=int, help="with --vector-column: the hyperplanes' seed (default 0)")
    d.add_argument("--master", help="Spark master, e.g. local[2] (default: from spark-submit)")
    args = ap.parse_args(argv)
    spark = _session(args.master)
    fmt = args.input_format
    if fmt == "auto":
        fmt = "parquet" if all(p.rstrip("/").endswith(".parquet") for p in args.input) else "jsonl"
    df = spark.read.parquet(*args.input) if fmt == "parquet" else spark.read.json(args.input)
    for col in (args.id_field, args.vector_column or args.text_field):
        if col not in df.columns:
            print(f"neardup.spark: error: the input has no {col!r} column (columns: {df.columns}); use --id-field/--text-field/--vector-column", file=sys.stderr)
            return 2
    kwargs = {k: v for k, v in [("bits", args.bits), ("features", args.features), ("tokenizer", args.tokenizer), ("weights", args.weights), ("seed", args.seed)] if v is not None}
    if args.vector_column:
        kwargs["vector_col"] = args.vector_column
        kwargs["min_similarity"] = args.min_similarity
    started = time.time()
    result = dedup(
        spark, df, id_col=args.id_field, text_col=args.text_field, k=args.k,
        verify=False if args.no_verify else args.verify, max_group=args.max_group, **kwargs,
    )
    t = time.time()
    write(result, args.output, args.format)
    result.stages["write"] = time.time() - t
    total = time.time() - started
    stages = ", ".join(f"{k} {v:.1f} s" for k, v in result.stages.items())
    print(f"neardup.spark: done in {total:.1f} s ({stages}); output in {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
