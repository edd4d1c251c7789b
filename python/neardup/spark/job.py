"""The job description: one run of :func:`neardup.spark.dedup`, its settings
resolved once from its arguments.

Reads dedup()'s arguments (and, on the driver, the IDF table's file, which
is broadcast to the executors). Shuffles nothing. Returns a :class:`Job`,
which every stage takes. Its methods :meth:`Job.rows_of` and
:meth:`Job.place_of` run in the executors' Python workers (a job travels
with the functions that call them), so its fields are plain values,
broadcasts and the readers' descriptions, never a DataFrame or the session.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

import neardup
from neardup import _neardup as _rs

from .arrow import _text_buffers
from .read import _POS_SHIFT, LocalSplits, Positions

# The most documents the driver joins by default, for what only it does
# (about 175 bytes each there: 16 of fingerprint, 144 of verification
# summary, 8 of position).
DRIVER_DOCUMENTS = 20_000_000


class ByPartition:
    """An accumulator (``SparkContext.accumulator({}, ByPartition())``) of a
    value per partition, each task adding ``{partition id: value}``: a
    partition computed again replaces its value, never adds it twice."""

    def zero(self, value: dict) -> dict:
        return {}

    def addInPlace(self, a: dict, b: dict) -> dict:
        a.update(b)
        return a


@dataclass
class Job:
    """What a run does: its documents, fingerprints, candidates, clusters
    and input order."""

    # The documents: the column holding each one (``json_col``,
    # ``features_col`` or ``text_col``), the field of a JSON Lines record
    # holding its text or features, and the ids.
    body: str
    field: str
    id_col: str
    json_col: Optional[str]
    #: The ids' Spark type (strings for JSON Lines records, whose ids are
    #: kept as JSON text until the outputs name them); None when ``df`` has
    #: no ``id_col`` (refused when the records are read).
    id_type: Any
    weighted: bool
    skip_invalid: bool
    # Fingerprints and candidates.
    cfg_json: str
    bits: int
    k: int
    threshold: Optional[float]
    centred: bool
    #: The IDF table's bytes, broadcast (None without a table).
    idf: Any
    max_group: int
    # Clusters and outputs.
    policy: str
    keep_by: str
    #: ``keep_by`` unless it is ``first`` (then None).
    rule: Optional[str]
    #: The column of ``field:NAME`` for rows of columns (JSON Lines records
    #: carry their keys in the fingerprint pass's rows).
    key_field: Optional[str]
    pairs: bool
    annotate: bool
    #: The driver joins up to this many documents; None: only the jobs the
    #: distributed path cannot do, up to :data:`DRIVER_DOCUMENTS`.
    driver_documents: Optional[int]
    quiet: bool
    # Input order.
    #: Numbers each batch's rows (:class:`Positions`).
    positions: Positions
    #: Whether the rows come from :func:`neardup.spark.read_records`
    #: (numbered in each pass), not numbered here by a ``_pos`` column.
    from_files: bool
    #: The columns :attr:`positions` reads.
    meta: list
    #: The executors' own reader of the input, or None when Spark reads it.
    splits: Optional[LocalSplits]
    #: File rank -> file, for messages.
    files: dict
    #: Where the fingerprint pass keeps the feature sets for the exact
    #: check (:class:`~.spill.Spill`), or None: the check reads the texts.
    spill: Any = None

    @property
    def driver_only(self) -> bool:
        """Whether only the driver join does this job: the incremental
        policy, an IDF table, weighted features or annotations."""
        return self.policy != "components" or self.idf is not None or self.weighted or self.annotate

    @property
    def driver_limit(self) -> int:
        """The most documents the driver joins: ``driver_documents``, else
        :data:`DRIVER_DOCUMENTS`."""
        return self.driver_documents if self.driver_documents is not None else DRIVER_DOCUMENTS

    def joins_on_driver(self, n: int) -> bool:
        """Whether the driver joins these ``n`` documents (stages 2-4): up to
        ``driver_documents`` when given, else only a job the distributed
        path cannot do, up to :data:`DRIVER_DOCUMENTS`."""
        return n <= self.driver_limit and (self.driver_documents is not None or self.driver_only)

    def rows_of(self, b: Any, p: Any, summaries: bool, features: bool, fingerprints: bool = True, packed: bool = False) -> tuple:
        """Core's reading of batch ``b`` (positions ``p``): the records'
        fingerprints, ids, keys and, as asked, summaries and feature sets
        (``packed``: one buffer and their ends), and the rows they came from
        (invalid records fail the job unless skipped)."""
        c = _worker_config(self.cfg_json, self.idf)
        r = _rs.spark_rows(c, *_text_buffers(b.column(self.body)), self.json_col is not None, self.field, self.id_col,
                           keep_by=self.rule if (self.json_col is not None or self.keep_by == "longest") else None,
                           summaries=summaries, features=features, fingerprints=fingerprints,
                           shares=fingerprints and self.centred, weighted=self.weighted, packed=packed)
        if r["errors"] and not self.skip_invalid:
            row, msg = r["errors"][0]
            raise neardup.NeardupError(f"{self.place_of(int(p[row]))}: {msg}; fix the record, or pass --skip-invalid to skip such records")
        return r, np.frombuffer(r["rows"], dtype=np.uint32)

    def place_of(self, at: int) -> str:
        """Where the record at position ``at`` is, for messages."""
        if self.files:
            what = "row" if self.positions.parquet else "the line at byte offset"
            return f"{self.files[at >> _POS_SHIFT]}: {what} {at & ((1 << _POS_SHIFT) - 1)}"
        return f"the record at position {at}"


def describe(spark: Any, df: Any, *, id_col: str, text_col: str, json_col: Optional[str], k: Optional[int], verify: Any,
             policy: str, keep_by: str, against: Any, config: Any, idf: Optional[str], skip_invalid: bool, max_group: int,
             min_similarity: Optional[float], driver_documents: Optional[int], quiet: bool, positions: Optional[Positions],
             pairs: bool, splits: Optional[LocalSplits], centre: bool, features_col: Optional[str], annotate: bool,
             kwargs: dict, spill_dir: Optional[str] = None) -> Job:
    """The job of dedup()'s arguments (texts or weighted features), after
    refusing what it cannot do, in the order ``neardup dedup`` checks."""
    if policy not in ("components", "incremental"):
        raise neardup.NeardupError(f"policy {policy!r}: use components or incremental")
    weighted = features_col is not None
    if weighted:
        cfg, k = _features_settings(verify, k, config, kwargs, min_similarity, keep_by, against, idf)
        threshold, centred = None, False
    else:
        cfg, k, threshold, centred = _settings(verify, k, config, kwargs, centre, idf)
    idf_bytes = None
    if cfg.idf is not None:
        # Read on the driver, shipped to the executors.
        with open(cfg.idf, "rb") as f:
            idf_bytes = f.read()
    if annotate and json_col is None:
        taken = [c for c in ("cluster", "duplicate_of", "similarity") if c in df.columns]
        if taken:
            raise neardup.NeardupError(f"the input already has a column {taken[0]!r}, which annotate adds: rename it, "
                                       "or write the clusters and join them by id")
    if keep_by != "first" and json_col is None and keep_by != "longest":
        field = keep_by.split(":")[1] if keep_by.startswith("field:") else None
        if field is None or field not in df.columns:
            raise neardup.NeardupError(f"keep_by {keep_by!r}: use first, longest or field:NAME[:asc|desc] with a column of df")
    from_files = positions is not None
    if from_files:
        # From read_records: numbered in each pass.
        meta = ["_pos"] if splits is not None else ["_file", "_row"] if positions.parquet else ["_file", "_start"]
    else:
        positions = Positions({}, False)
        meta = ["_pos"]
    if json_col:
        from pyspark.sql import types as T

        id_type = T.StringType()
    else:
        id_type = df.schema[id_col].dataType if id_col in df.columns else None
    return Job(
        body=json_col or features_col or text_col,
        field=features_col if weighted else text_col,
        id_col=id_col,
        json_col=json_col,
        id_type=id_type,
        weighted=weighted,
        skip_invalid=skip_invalid,
        cfg_json=cfg.to_json(),
        bits=cfg.bits,
        k=k,
        threshold=threshold,
        centred=centred,
        idf=spark.sparkContext.broadcast(idf_bytes) if idf_bytes is not None else None,
        max_group=max_group,
        policy=policy,
        keep_by=keep_by,
        rule=keep_by if keep_by != "first" else None,
        key_field=keep_by.split(":")[1] if (json_col is None and keep_by.startswith("field:")) else None,
        pairs=pairs,
        annotate=annotate,
        driver_documents=driver_documents,
        quiet=quiet,
        positions=positions,
        from_files=from_files,
        meta=meta,
        splits=splits,
        files={r: f for f, r in positions.ranks.items()},
        spill=_spill(spark, splits, threshold, spill_dir),
    )


def _spill(spark: Any, splits: Optional[LocalSplits], threshold: Optional[float], spill_dir: Optional[str]) -> Any:
    """A folder for the feature sets (:class:`~.spill.Spill`) when the
    executors read the input and the pairs are verified: ``spill_dir``'s,
    else in local mode a temporary folder; None on a cluster without
    ``spill_dir`` (the exact check reads the texts again)."""
    import tempfile

    from .spill import Spill

    if splits is None or threshold is None or (spill_dir is None and not spark.sparkContext.master.startswith("local")):
        return None
    try:
        folder = tempfile.mkdtemp(prefix="neardup-spill-", dir=spill_dir)
    except OSError as e:
        raise neardup.NeardupError(f"{spill_dir}: cannot make a folder there ({e.strerror}); "
                                   "give a folder every executor can write") from None
    return Spill(folder, [(rank << _POS_SHIFT) | start for _, rank, start, _, _ in splits.ranges])


def _settings(verify: Any, k: Optional[int], config: Any, kwargs: dict, centre: bool = True, idf: Any = None):
    """The configuration, k, the verification threshold, and whether the
    candidates are centred on the corpus, as ``neardup dedup`` picks them."""
    threshold = neardup._verify_threshold(verify)
    cfg, candidates = neardup._dedup_config(threshold is not None, config, dict(kwargs, idf=idf))
    centred = candidates and centre
    if k is None:
        k = _rs.centred_k(cfg.bits) if centred else _rs.default_k(cfg.bits, threshold is not None)
    return cfg, k, threshold, centred


def _features_settings(verify: Any, k: Optional[int], config: Any, kwargs: dict, min_similarity: Optional[float],
                       keep_by: str, against: Any, idf: Any) -> tuple:
    """The configuration and k of weighted features, as ``neardup dedup
    --features-field`` picks them: 128-bit fingerprints unless ``bits`` says
    otherwise (``hash``, ``seed``; the text pipeline's settings refused), k
    the largest distance whose estimated cosine similarity reaches
    ``min_similarity`` (default 0.95), no verification."""
    if verify not in (True, False, None):
        raise neardup.ConfigError(
            "--verify jaccard:T compares texts; weighted features are paired by estimated cosine similarity: "
            f"set --min-similarity S (default {neardup.DEFAULT_COSINE})")
    if keep_by == "longest":
        raise neardup.ConfigError("--keep-by longest compares texts' lengths; use first or field:NAME for weighted features")
    if against is not None:
        raise neardup.ConfigError("--against takes texts; deduplicate weighted features without it (as neardup dedup)")
    if idf is not None:
        raise neardup.ConfigError("an IDF table weighs a text's features; weighted features come with their weights")
    cos = neardup.DEFAULT_COSINE if min_similarity is None else float(min_similarity)
    if not -1.0 <= cos <= 1.0:
        raise neardup.ConfigError(f"--min-similarity {cos} is out of range: use a similarity in [-1, 1], e.g. 0.9")
    given = {key: value for key, value in kwargs.items() if value is not None}
    cfg = _rs.features_dedup_config(config, json.dumps(given))
    most = cfg.bits // 8
    if k is None:
        k = _rs.default_vector_k(cfg.bits, cos, False)
    if k > most:
        raise neardup.ConfigError(f"--k {k} is too large for {cfg.bits}-bit fingerprints: use at most {most}")
    return cfg, k


_CONFIGS: dict = {}


def _worker_config(key: str, idf: Any) -> Any:
    """The job's configuration in a Python worker, made once per worker
    process (an IDF table is parsed once, not per batch); ``key`` is the full
    configuration's JSON, which names the table by its digest, and ``idf``
    the broadcast bytes of the table."""
    if key not in _CONFIGS:
        _CONFIGS[key] = _rs.config_from_parts(key, idf.value if idf is not None else None)
    return _CONFIGS[key]
