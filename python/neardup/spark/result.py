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
    #: Write ``pairs`` and ``clusters`` as JSON Lines into a local folder from
    #: the ids the fingerprint pass kept (False, writing nothing, once they
    #: are gone), or None.
    write_pairs_local: Any = None
    write_clusters_local: Any = None
    #: Removes the folder the fingerprint pass kept feature sets and ids in
    #: (also done when the result is garbage collected, or at exit), or None.
    _release: Any = None

    def close(self) -> None:
        """Frees what the run kept on disk for writing the outputs (the
        DataFrames stay usable)."""
        if self._release is not None:
            self._release()
