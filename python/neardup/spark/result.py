"""What a run returns: :class:`SparkDedupResult`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class SparkDedupResult:
    """DataFrames of a Spark dedup, and the wall time of each stage."""

    pairs: Any
    clusters: Any
    deduped: Any
    stages: dict
    #: ``deduped`` holds JSON Lines records (one string column), written as text.
    json_records: bool = False
    #: Writes ``deduped`` as JSON Lines into a local folder from the executors'
    #: own reads of the input (:class:`LocalSplits`), without the JVM.
    write_local: Any = None
    #: With ``annotate``: every record (``neardup dedup --annotate``), with
    #: ``cluster``, ``duplicate_of`` and ``similarity`` added.
    annotated: Any = None
    #: Writes ``annotated`` as ``write_local`` writes ``deduped``.
    write_annotated_local: Any = None
    #: Per-stage figures (seconds, rows, bytes shuffled): see ``--report``.
    report: Any = None
