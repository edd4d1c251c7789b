"""The driver join (documents up to ``driver_documents``): stages 2 to 4 on
the driver, over every document's fingerprint and summary there.

Reads the fingerprint pass's rows, collected to the driver (about 175 bytes
a document: position, fingerprint or shares, summary, keep-by key), and
the positions of skipped records. Candidates are joined as ``neardup
dedup`` joins them and screened by their summaries (``spark_join``; with
``--no-pairs``, rounds of pairs that span the clusters, :func:`_spanning`);
the undecided pairs' documents are read again and checked exactly in the
executors (:mod:`.verify`: only those texts are shuffled, or none when the
executors read the input). Clusters by core's policies, with keep-by and
``against``'s preference. Returns the verified pairs and each document's
representative, as numpy arrays on the driver.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from neardup import _neardup as _rs

from .arrow import _packed, _to_arrow
from .job import Job
from .report import _log
from .verify import _exact_check, _exact_check_direct



@dataclass
class Collected:
    """The documents on the driver, in the join's order (old documents
    first, then input order): document i is at position ``pos[i]``."""

    pos: Any
    #: Documents of ``against`` (the first ``n_old``).
    n_old: int
    #: Positions of the records skipped as invalid.
    bad_pos: Any
    #: Fingerprints, (n, 2) words (high, low); dropped once joined.
    words: Any
    #: Summaries, 144 bytes a document, with verification; dropped once joined.
    sums: Optional[bytes]
    #: The new documents' keep-by keys (kinds, numbers, strings), with a rule.
    keys: Optional[tuple]
    #: When the collection began (the candidates' time counts from it).
    since: float


@dataclass
class Clusters:
    """Each document's representative (``reps[i]``, an index like i) and the
    documents moved to another's cluster."""

    reps: Any
    moved: Any


def collect(job: Job, fps: Any) -> Collected:
    """The fingerprint pass's rows on the driver (centred there, on every
    document's shares, old and new alike)."""
    from pyspark.sql import functions as F

    threshold, bits, n = job.threshold, job.bits, fps.n
    bad_pos = np.array([r[0] for r in fps.every.where(F.col("_bad")).select("_pos").collect()] if fps.skipped else [], dtype=np.int64)
    # Candidates: every fingerprint on the driver, joined as `neardup dedup` joins them.
    since = time.monotonic()
    cols = (["_pos", "_new"] + (["shares"] if job.centred else ["fp_hi", "fp_lo"]) + (["summary"] if threshold is not None else [])
            + (["key_kind", "key_num", "key_str"] if job.rule else []))
    table = _to_arrow(fps.rows.select(*cols))
    new_flag = table.column("_new").to_numpy(zero_copy_only=False).astype(bool)
    order = np.lexsort((table.column("_pos").to_numpy(), new_flag))
    pos = table.column("_pos").to_numpy()[order]
    n_old = int((~new_flag).sum())
    words = np.empty((n, 2), dtype="<u8")
    if job.centred:
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
    if job.rule:
        new_order = order[n_old:]
        keys = (
            table.column("key_kind").to_numpy().astype(np.uint8)[new_order].tobytes(),
            table.column("key_num").to_numpy().astype(np.float64)[new_order].tobytes(),
            table.column("key_str").take(new_order).to_pylist(),
        )
    del table
    _log(job.quiet, f"collect: {n:,} fingerprints{' and summaries' if threshold is not None else ''} on the driver in "
         f"{time.monotonic() - since:.1f} s")
    return Collected(pos, n_old, bad_pos, words, sums, keys, since)


def pairs(spark: Any, job: Job, records: Any, docs: Collected, stages: dict) -> tuple:
    """Stages 2 and 3: the candidate pairs, screened by their summaries, and
    the undecided ones checked exactly. Every candidate pair when the pairs
    are written, another policy clusters them or annotations rate each
    record by its best pair; else only enough to span the clusters. Drops
    ``docs``' fingerprints and summaries. Returns the verified pairs
    ((i, j, distance) rows, i < j) and their scores (-1 unverified)."""
    threshold, k, n, quiet = job.threshold, job.k, len(docs.pos), job.quiet
    words, sums = docs.words, docs.sums
    docs.words = docs.sums = None

    def exact_check(undecided, kept, scores):
        return _exact(spark, job, records, docs.pos, undecided, kept, scores)

    if job.pairs or job.policy != "components" or job.annotate:
        # (--annotate gives each record its best similarity: every pair verified.)
        kept, scores, undecided = _rs.spark_join(words.tobytes(), job.bits, k, sums, threshold)
        del words, sums
        kept = np.frombuffer(kept, dtype="<i8").reshape(-1, 3)
        scores = np.frombuffer(scores, dtype="<f8")
        undecided = np.frombuffer(undecided, dtype="<i8").reshape(-1, 3)
        stages["candidates"] = time.monotonic() - docs.since
        _log(quiet, f"candidates: {len(kept) + len(undecided):,} pairs within k = {k}"
             f"{f', {len(undecided):,} left to the exact check' if threshold is not None else ''} in {stages['candidates']:.1f} s")

        t2 = time.monotonic()
        if len(undecided):
            kept, scores = exact_check(undecided, kept, scores)
        stages["verify"] = time.monotonic() - t2
        if threshold is not None:
            _log(quiet, f"verify: {len(kept):,} pairs at Jaccard >= {threshold} in {stages['verify']:.1f} s")
        return kept, scores
    kept, scores = _spanning(spark, words.tobytes(), job.bits, k, sums, threshold, n, stages, quiet,
                             lambda und: exact_check(und, np.empty((0, 3), dtype=np.int64), np.empty(0)))
    return kept, scores


def clusters(job: Job, docs: Collected, kept: Any, stages: dict, report: Any) -> Clusters:
    """Stage 4: the clusters of the verified pairs, by the job's policy and
    keep-by rule, ``against``'s documents preferred and never removed."""
    n = len(docs.pos)
    t3 = time.monotonic()
    a32, b32 = kept[:, 0].astype(np.uint32), kept[:, 1].astype(np.uint32)
    reps = np.frombuffer(
        _rs.resolve_pairs(n, a32.tobytes(), b32.tobytes(), job.policy, job.rule, *(docs.keys or (None, None, None)), old=docs.n_old),
        dtype=np.uint32,
    ).astype(np.int64)
    stages["components"] = time.monotonic() - t3
    moved = np.nonzero(reps != np.arange(n))[0]
    for name in ("candidates", "verify", "components"):
        report.done(name, stages.get(name, 0.0), n)
    _log(job.quiet, f"{job.policy}: {len(moved[moved >= docs.n_old]):,} documents removed in {stages['components']:.2f} s")
    return Clusters(reps, moved)


def _exact(spark: Any, job: Job, records: Any, pos: Any, undecided: Any, kept: Any, scores: Any) -> tuple:
    """The exact check of ``undecided`` ((i, j, distance) rows): ``kept`` and
    ``scores`` with the pairs that pass. The executors read the documents
    at their byte offsets when they read the input, else Spark reads it."""
    if job.splits is not None:
        return _exact_check_direct(spark, job.splits, job.rows_of, pos, undecided, job.threshold, kept, scores, job.spill)

    def texts(fn, schema):
        return records.select(*{c: None for c in job.meta + [job.body]}).mapInArrow(fn, schema)

    return _exact_check(spark, texts, job.body, job.positions, job.rows_of, pos, undecided, job.threshold, kept, scores)


def _centred(shares: bytes, bits: int) -> np.ndarray:
    """Centred fingerprints of all documents' shares, as (n, 2) high and low
    words (128 bits) or n words (64)."""
    words = np.frombuffer(_rs.centred_words(shares, _rs.centre_of(shares, bits)), dtype="<u8")
    return words.reshape(-1, 2) if bits == 128 else words



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
