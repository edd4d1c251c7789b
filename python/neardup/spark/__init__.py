"""Corpus-scale dedup on Apache Spark, with the same answers as ``neardup dedup``.

Command line (every option of ``neardup dedup``'s pipeline; ``--help``)::

    python -m neardup.spark dedup --input corpus.jsonl --output out/ [--format parquet|jsonl]

From your own PySpark code::

    from neardup.spark import dedup
    result = dedup(spark, df, id_col="id", text_col="text")
    result.pairs, result.clusters, result.deduped      # DataFrames

How it runs (uncompressed JSON Lines files on a file system every executor
sees are read by the executors' Python workers themselves, in byte ranges,
see :class:`LocalSplits`; other inputs by Spark), with nothing per document
on the driver:

1. Fingerprints (:mod:`.fingerprint`; one pass over the input, in the executors): whole Arrow
   batches go to Rust (``mapInArrow``), which parses the JSON Lines records,
   and returns each document's fingerprint, id, keep-by key and, with
   verification, a 144-byte summary of its feature set (count, digest,
   124-byte MinHash sketch); each task sends the driver its counts and the
   sums that centre the fingerprints. Each row's position in input order is
   computed in the same worker from its file and byte offset
   (:class:`Positions`), so every pass finds the same numbers without a pass
   of its own. With a spill folder (local mode, ``spill_dir``, or on a
   cluster the command line's beside ``--output``) each document's feature
   set and id are kept there.
2. Candidates (:mod:`.candidates`, via :mod:`.distributed`): the rows centred
   on the corpus, keyed k + 1 times by block and joined in Rust group by
   group (core's ``Pigeonhole``: the same pairs as the CLI's join, a group
   larger than ``max_group`` split into block pairs); each pair screened by
   its summaries as ``neardup dedup`` screens it, and, with the spilled
   feature sets, the undecided ones checked exactly by the same task.
3. Exact check (:mod:`.verify`), without a spill folder: undecided pairs
   checked per connected component, their documents read at their byte
   offsets (or shuffled to the check's bucket when Spark reads the input).
4. Clusters (:mod:`.components`): a union-find per task, then one task (or
   large-star/small-star rounds); each cluster's keeper chosen by keep-by
   (the first in input order by default), the documents of ``against``
   preferred.
5. Outputs (:mod:`.outputs`, written by :mod:`.writing`): the kept records
   streamed from each input range minus its removed positions, unchanged;
   with the spilled ids, the JSON Lines pairs and clusters written by the
   executors.

With ``against``, the existing set is read but never shuffled: the new
batch is broadcast and indexed in each worker, and every partition of the
existing set looks its documents up in it (:func:`.candidates._batch_pairs`).
``--report FILE`` writes each stage's seconds, rows and bytes shuffled
(:mod:`.report`). Ids of JSON Lines records are read as integers when every
one is, else as strings.

The driver joins instead (:mod:`.driver`: the fingerprints and summaries,
about 175 bytes a document, collected and joined in one process, the
exact check in the executors, clusters on the driver, annotations by
:mod:`.annotate`) up to ``driver_documents`` when given, and by default,
up to :data:`DRIVER_DOCUMENTS` (20 million), for what only it does: the
incremental policy, an IDF table, weighted features and annotations.

Outputs under ``--output DIR``: ``DIR/pairs`` (columns ``a``, ``b``,
``distance``, and ``jaccard`` when verified), ``DIR/clusters``
(``representative``, ``size``, ``members``) and ``DIR/deduped`` (the
surviving input records, unchanged), Parquet by default or JSON Lines; with
``--annotate``, ``DIR/annotated`` (every record with ``cluster``,
``duplicate_of`` and ``similarity`` added, as ``neardup dedup --annotate``).
``--features-field`` takes weighted features instead of texts.

The modules, each a stage or what the stages share (each module's
docstring says what it reads, shuffles and writes):

- :mod:`.pipeline`: :func:`dedup`, the stages in order.
- :mod:`.job`: the job description (:class:`~.job.Job`), settings resolved
  once from dedup()'s arguments; every stage takes it.
- :mod:`.read`: the input in input order (:func:`read_records`,
  :class:`Positions`, :class:`LocalSplits`, :func:`read_lines_at`).
- :mod:`.fingerprint`: stage 1.
- :mod:`.driver`: stages 2 to 4 on the driver; :mod:`.verify`: stage 3's
  exact check in the executors, for both paths.
- :mod:`.distributed`: stages 2 to 5 in the executors, over
  :mod:`.candidates`, :mod:`.verify` and :mod:`.components`.
- :mod:`.outputs`, :mod:`.annotate`: stage 5; :mod:`.writing`: :func:`write`.
- :mod:`.vectors`: dense vectors' own path.
- :mod:`.result`, :mod:`.report`, :mod:`.arrow`: the result, the run's
  figures and log lines, shared Arrow helpers; :mod:`.cli`: :func:`main`.

The tuning constants are importable from here, and read from the module
that uses them (set them there, e.g. ``neardup.spark.driver.SPAN_BUDGET``): :data:`MAX_GROUP`,
CANDIDATE_ROWS_PER_TASK, SPAN_UNDECIDED_PER_ROW and SPAN_CACHE_BYTES in
:mod:`.candidates`; :data:`DRIVER_DOCUMENTS` in :mod:`.job`; SPAN_BUDGET in
:mod:`.driver`; EXACT_PAIRS_PER_TASK and EXACT_DOCS_PER_TASK in
:mod:`.verify`; ONE_TASK_EDGES and EDGES_PER_TASK in :mod:`.components`;
DOCUMENTS_PER_PARTITION in :mod:`.distributed`.
"""

from .candidates import CANDIDATE_ROWS_PER_TASK, MAX_GROUP, SPAN_CACHE_BYTES, SPAN_UNDECIDED_PER_ROW
from .cli import main
from .components import EDGES_PER_TASK, ONE_TASK_EDGES
from .distributed import DOCUMENTS_PER_PARTITION
from .driver import SPAN_BUDGET
from .job import DRIVER_DOCUMENTS
from .pipeline import dedup
from .read import NEW_AFTER, LocalSplits, Positions, read_lines_at, read_ranges, read_records
from .result import SparkDedupResult
from .verify import EXACT_DOCS_PER_TASK, EXACT_PAIRS_PER_TASK
from .writing import write

__all__ = [
    "CANDIDATE_ROWS_PER_TASK",
    "DOCUMENTS_PER_PARTITION",
    "DRIVER_DOCUMENTS",
    "EDGES_PER_TASK",
    "EXACT_DOCS_PER_TASK",
    "EXACT_PAIRS_PER_TASK",
    "MAX_GROUP",
    "NEW_AFTER",
    "ONE_TASK_EDGES",
    "SPAN_BUDGET",
    "SPAN_CACHE_BYTES",
    "SPAN_UNDECIDED_PER_ROW",
    "LocalSplits",
    "Positions",
    "SparkDedupResult",
    "dedup",
    "main",
    "read_lines_at",
    "read_ranges",
    "read_records",
    "write",
]
