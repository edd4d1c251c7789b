"""Stage 4 on the distributed path, components: each document's cluster.

Reads the verified pairs (``a``, ``b``). Joins each partition's pairs by a
union-find in its task (no shuffle), then the rest in one task, or in
large-star/small-star rounds (each a shuffle of the remaining edges) when
more than ONE_TASK_EDGES remain (:func:`_components`). With a keep-by rule,
each cluster's kept document is chosen by a window over the clustered
documents' keys (:func:`_keepers`, a shuffle by cluster). Returns
(``_pos``, ``rep``) for every clustered document.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import numpy as np

from neardup import _neardup as _rs


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
