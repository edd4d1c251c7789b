"""The job: :func:`dedup`, its stages in order over one :class:`~.job.Job`.

1. :func:`.fingerprint.fingerprint`, in the executors;
2-4 in the executors (:func:`.distributed.run`), or on the driver up to
``driver_documents`` documents when given, and by default for what only the
driver join does, up to :data:`.job.DRIVER_DOCUMENTS` (:func:`.driver.collect`,
:func:`.driver.pairs`, :func:`.driver.clusters`);
5. the outputs (:mod:`.outputs`, and :mod:`.annotate` with annotations).
Vectors take their own path (:mod:`.vectors`).
"""

from __future__ import annotations

import shutil
import weakref
from typing import Any, Optional

import numpy as np

import neardup

from . import distributed, driver
from .annotate import annotations
from .candidates import MAX_GROUP
from .fingerprint import fingerprint, job_records
from .job import Job, describe
from .outputs import kept_on_driver, named_on_driver
from .read import LocalSplits, Positions
from .report import _Report
from .result import SparkDedupResult
from .vectors import _dedup_vectors


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
    driver_documents: Optional[int] = None,
    quiet: bool = True,
    positions: Optional[Positions] = None,
    pairs: bool = True,
    splits: Optional[LocalSplits] = None,
    centre: bool = True,
    features_col: Optional[str] = None,
    annotate: bool = False,
    spill_dir: Optional[str] = None,
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

    ``driver_documents``: the driver joins up to this many documents (about
    175 bytes of driver memory each; on one machine the quicker way for a
    few million); by default the executors join, with nothing per document
    on the driver, except for what only the driver join does (policy
    incremental, ``idf``, ``features_col``, ``annotate``), up to
    :data:`~.job.DRIVER_DOCUMENTS`.

    ``spill_dir``: a folder every executor can write and read, where the
    fingerprint pass keeps each document's feature set for the exact check,
    and its id for the JSON Lines outputs (a temporary folder of the
    machine in local mode; without it on a cluster, the check reads its
    documents' texts again and the outputs are joined with the ids). Used
    when the executors read the input files themselves; the sets are
    removed when dedup returns, the ids by the result's ``close()`` (or
    when the result is garbage collected).
    """
    if vector_col is not None:
        if against is not None or policy != "components" or keep_by != "first" or json_col is not None:
            raise neardup.NeardupError("vectors are deduplicated with policy components and keep_by first, without against")
        if annotate or features_col is not None:
            raise neardup.NeardupError("vectors are not annotated here, nor mixed with weighted features: write the clusters and join them by id")
        return _dedup_vectors(spark, df, id_col=id_col, vector_col=vector_col, k=k, verify=verify, max_group=max_group,
                              min_similarity=min_similarity, **kwargs)
    job = describe(spark, df, id_col=id_col, text_col=text_col, json_col=json_col, k=k, verify=verify, policy=policy,
                   keep_by=keep_by, against=against, config=config, idf=idf, skip_invalid=skip_invalid, max_group=max_group,
                   min_similarity=min_similarity, driver_documents=driver_documents, quiet=quiet, positions=positions,
                   pairs=pairs, splits=splits, centre=centre, features_col=features_col, annotate=annotate, kwargs=kwargs,
                   spill_dir=spill_dir)
    try:
        result = _run(spark, job, df, against, order_col)
    except BaseException:
        if job.spill is not None:
            shutil.rmtree(job.spill.folder, ignore_errors=True)
        raise
    if job.spill is not None:
        if result.write_pairs_local is None and result.write_clusters_local is None:
            shutil.rmtree(job.spill.folder, ignore_errors=True)
        else:
            # The ids kept for the JSON Lines outputs' names until the result
            # is closed or gone (at exit at the latest); the sets, checked,
            # go now (and their pages with them).
            job.spill.drop_sets()
            result._release = weakref.finalize(result, shutil.rmtree, job.spill.folder, True)
    return result


def _run(spark: Any, job: Job, df: Any, against: Any, order_col: Optional[str]) -> SparkDedupResult:
    """The stages of :func:`dedup` over ``job``."""
    stages: dict = {}
    report = _Report(spark)
    records = job_records(job, df, against, order_col)
    # 1. Fingerprints, in the executors.
    fps = fingerprint(spark, job, records, stages, report)
    if not job.joins_on_driver(fps.n):
        # 2-5, every stage in the executors.
        return distributed.run(spark, job, records, fps, stages, report)
    # 2-4 on the driver: candidates, the exact check (in the executors), clusters.
    docs = driver.collect(job, fps)
    kept, scores = driver.pairs(spark, job, records, docs, stages)
    found = driver.clusters(job, docs, kept, stages, report)
    # 5. Outputs.
    out_pairs, clusters, names = named_on_driver(spark, job, fps.rows, docs.pos, docs.n_old, found.reps, found.moved,
                                                 kept, scores)
    removed = found.moved[found.moved >= docs.n_old]
    deduped, write_local = kept_on_driver(spark, job, records, np.concatenate([docs.pos[removed], docs.bad_pos]))
    result = SparkDedupResult(out_pairs, clusters, deduped, stages, job.json_col is not None, write_local=write_local,
                              report=report)
    if job.annotate:
        annotations(spark, job, result, records, names, found.reps, kept, scores, docs.n_old, docs.bad_pos)
    return result
