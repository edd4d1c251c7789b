"""Stage 1, fingerprints: one pass over the input, in the executors.

Reads the input's records (:func:`job_records`: read by the executors in byte
ranges, or by Spark), whole Arrow batches handed to Rust (``mapInArrow``),
which parses JSON Lines records. Shuffles nothing; each task sends the
driver a tally of its rows by kind (skipped or not, new or old: counts and
the range of positions) and, to centre, the sums of its documents' shares
(an accumulator: no second pass over the rows). Writes a checkpoint of
one row per record: position, whether it is new (not ``against``'s) or
skipped as invalid, fingerprint, id and, as the job needs them, the
144-byte verification summary (count, digest, MinHash sketch), the shares
to centre the fingerprints on the corpus, and the keep-by key; with a
spill folder (:mod:`.spill`), each document's feature set and summary
there, for the join and the exact check.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

import neardup

from neardup import _neardup as _rs

from .arrow import _fixed_rows, _zero
from .job import ByPartition, Job
from .read import NEW_AFTER
from .report import _log


@dataclass
class Fingerprints:
    """The fingerprint pass's rows and counts."""

    #: Every row, skipped records' included (``_bad``).
    every: Any
    #: The documents' rows (those of valid records).
    rows: Any
    #: (skipped, new) -> (count, smallest position, largest position).
    kinds: dict
    #: Documents, and invalid records skipped.
    n: int
    skipped: int
    #: With centring, the sums of every document's shares (core's
    #: ``centre_of``: bits + 1 little-endian u64), else None.
    centre: Optional[bytes] = None
    #: Whether a JSON Lines record's id is a string (else every one is an
    #: integer).
    string_ids: bool = False


def job_records(job: Job, df: Any, against: Any, order_col: Optional[str]) -> Any:
    """The rows the job reads: ``df`` as given when it comes from
    :func:`neardup.spark.read_records` (numbered in each pass), else ``df``
    and ``against`` with a position ``_pos`` (``order_col``'s, else the order
    Spark reads; the old documents first) and ``_new``."""
    from pyspark.sql import functions as F

    def positioned(frame, new):
        if "_pos" in frame.columns and "_new" in frame.columns:
            return frame
        pos = F.col(order_col).cast("long") if order_col else F.monotonically_increasing_id()
        if new and against is not None:
            pos = pos + F.lit(NEW_AFTER)  # the old documents' positions come first
        return frame.withColumn("_pos", pos).withColumn("_new", F.lit(new))

    if job.from_files:
        out = df  # from read_records: numbered in each pass
    else:
        out = positioned(df, True)
        if against is not None:
            out = positioned(against, False).unionByName(out)
    for col in [job.body] + ([] if job.json_col else [job.id_col]):
        if col not in out.columns:
            raise neardup.NeardupError(f"the input has no {col!r} column (columns: {[c for c in df.columns]})")
    return out


def fingerprint(spark: Any, job: Job, records: Any, stages: dict, report: Any) -> Fingerprints:
    """The fingerprint pass (its time in ``stages`` and ``report``)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import to_arrow_schema

    t0 = time.monotonic()
    json_col, id_col, threshold, centred, rule, key_field = job.json_col, job.id_col, job.threshold, job.centred, job.rule, job.key_field
    pos_of = job.positions
    out_fields = [
        T.StructField("_pos", T.LongType(), False),
        T.StructField("_new", T.BooleanType(), False),
        T.StructField("_bad", T.BooleanType(), False),
        T.StructField("fp_hi", T.LongType(), False),
        T.StructField("fp_lo", T.LongType(), False),
        T.StructField("_id", job.id_type, True),
    ]
    if threshold is not None:
        out_fields.append(T.StructField("summary", T.BinaryType(), False))
    if centred:
        out_fields.append(T.StructField("shares", T.BinaryType(), False))
    if rule is not None:
        out_fields += [T.StructField("key_kind", T.ByteType(), False), T.StructField("key_num", T.DoubleType(), False), T.StructField("key_str", T.StringType(), True)]
    fp_schema = T.StructType(out_fields)
    arrow_schema = to_arrow_schema(fp_schema)
    bits = job.bits if centred else None
    tallies = spark.sparkContext.accumulator({}, ByPartition())

    def fingerprint_batches(batches):
        import pyarrow as pa
        import pyarrow.compute as pc
        from pyspark import TaskContext

        state = {}
        writer = job.spill.writer() if job.spill is not None else None
        tally = _Tally(bits)
        for b in batches:
            p = pa.array(pos_of(b, state))
            r, rows = job.rows_of(b, p, threshold is not None, writer is not None, packed=True)
            kept_pos = p.to_numpy()[rows]
            tally.add(b.column("_new").to_numpy(zero_copy_only=False)[rows], kept_pos, r.get("shares"))
            # The records' ids as JSON text (JSON Lines), once for every use.
            ids = pa.array(r["ids"], type=pa.string()) if json_col else None
            if ids is not None and len(ids):
                tally.string_ids |= pc.any(pc.starts_with(ids, '"')).as_py()
            if writer is not None:
                writer.add(kept_pos, r["features"], np.frombuffer(r["feature_ends"], dtype="<u8"), ids, r.get("summaries"))
            take = pa.array(rows.astype(np.int64))
            fp = np.frombuffer(r["fp"], dtype="<u8").reshape(-1, 2)
            if r["errors"]:
                # Skipped records (--skip-invalid): one row each, marked bad,
                # so that they are counted and left out of the kept records.
                bad = pc.take(p, pa.array([row for row, _ in r["errors"]], type=pa.int64()))
                m = len(bad)
                tally.add_bad(bad.to_numpy())
                filler = {"_pos": bad, "_new": pa.array(np.zeros(m, dtype=bool)), "_bad": pa.array(np.ones(m, dtype=bool))}
                yield pa.RecordBatch.from_arrays(
                    [
                        filler[f.name] if f.name in filler else pa.nulls(m, f.type) if f.name == "_id" else pa.array([_zero(f.type)] * m, type=f.type)
                        for f in arrow_schema
                    ],
                    schema=arrow_schema,
                )
            cols = [
                pc.take(p, take),
                pc.take(b.column("_new"), take),
                pa.array(np.zeros(len(rows), dtype=bool)),
                pa.array(fp[:, 0].view(np.int64)),
                pa.array(fp[:, 1].view(np.int64)),
                ids if json_col else pc.take(b.column(id_col), take),
            ]
            if threshold is not None:
                cols.append(_fixed_rows(r["summaries"], len(rows)))
            if centred:
                cols.append(_fixed_rows(r["shares"], len(rows)))
            if rule is not None:
                if key_field is not None:
                    kc = pc.take(b.column(key_field), take)
                    if pa.types.is_string(kc.type) or pa.types.is_large_string(kc.type):
                        kind = np.where(pc.is_null(kc).to_numpy(zero_copy_only=False), 2, 1)
                        cols += [pa.array(kind.astype(np.int8)), pa.array(np.zeros(len(rows))), kc.cast(pa.string())]
                    else:
                        nums = kc.cast(pa.float64())
                        kind = np.where(pc.is_null(nums).to_numpy(zero_copy_only=False), 2, 0)
                        cols += [pa.array(kind.astype(np.int8)), pc.fill_null(nums, 0.0), pa.nulls(len(rows), pa.string())]
                else:
                    cols += [
                        pa.array(np.frombuffer(r["key_kind"], dtype=np.int8)),
                        pa.array(np.frombuffer(r["key_num"], dtype=np.float64)),
                        pa.array(r["key_str"], type=pa.string()),
                    ]
            yield pa.RecordBatch.from_arrays(cols, schema=arrow_schema)
        if writer is not None:
            writer.close()
        tallies.add({TaskContext.get().partitionId(): (tally.kinds, tally.sums, tally.string_ids)})

    if job.splits is not None:
        fps = job.splits.map(spark, fingerprint_batches, fp_schema, large=True)
    else:
        body = job.body
        wanted = {c: None for c in job.meta + ["_new", body] + ([] if json_col else [id_col]) + ([key_field] if key_field else [])}
        fps = records.select(*[_features_json(records, c) if (job.weighted and c == body and not json_col) else c for c in wanted])
        fps = fps.mapInArrow(fingerprint_batches, fp_schema)
    fps = fps.localCheckpoint()
    kinds, centre, string_ids = _merged(tallies.value.values(), bits)
    n = sum(c for (b, _), (c, *_) in kinds.items() if not b)
    skipped = sum(c for (b, _), (c, *_) in kinds.items() if b)
    stages["fingerprint"] = time.monotonic() - t0
    _log(job.quiet, f"fingerprint: {n:,} documents{f' ({skipped:,} invalid records skipped)' if skipped else ''} in {stages['fingerprint']:.1f} s")
    report.documents = n
    report.done("fingerprint", stages["fingerprint"], n, records=n + skipped, skipped=skipped)
    return Fingerprints(fps, fps.where(~F.col("_bad")), kinds, n, skipped, centre, string_ids)


class _Tally:
    """One task's rows: ``kinds``, (skipped, new) -> [count, smallest
    position, largest position]; ``sums``, with ``bits``, the sums of its
    documents' shares (core's ``centre_of``: bits + 1 u64), else None;
    ``string_ids``, whether a JSON Lines record's id is a string."""

    def __init__(self, bits: Optional[int]):
        self.bits = bits
        self.kinds: dict = {}
        self.sums: Any = None
        self.string_ids = False

    def add(self, new: Any, pos: Any, shares: Optional[bytes]) -> None:
        """Documents at positions ``pos``, new or not (``new``), with their
        packed ``shares`` when the job centres."""
        for flag in (False, True):
            mine = new == flag
            if mine.any():
                self._count((False, flag), pos[mine])
        if self.bits is not None and len(pos):
            sums = np.frombuffer(_rs.centre_of(shares, self.bits), dtype="<u8")
            self.sums = sums.copy() if self.sums is None else self.sums + sums

    def add_bad(self, pos: Any) -> None:
        """Records skipped as invalid, at positions ``pos``."""
        if len(pos):
            self._count((True, False), pos)

    def _count(self, kind: tuple, pos: Any) -> None:
        lo, hi = int(pos.min()), int(pos.max())
        entry = self.kinds.setdefault(kind, [0, lo, hi])
        entry[0] += len(pos)
        entry[1], entry[2] = min(entry[1], lo), max(entry[2], hi)


def _merged(tallies: Any, bits: Optional[int]) -> tuple:
    """The partitions' tallies (kinds, sums, string ids) as one: (skipped,
    new) -> (count, smallest position, largest position); with ``bits``
    the sums of every document's shares (the centre, as core's
    ``centre_of`` adds them); whether an id is a string."""
    kinds: dict = {}
    centre = np.zeros(bits + 1, dtype=np.uint64) if bits is not None else None
    string_ids = False
    for counts, sums, strings in tallies:
        string_ids |= strings
        for kind, (count, lo, hi) in counts.items():
            was = kinds.get(kind, (0, lo, hi))
            kinds[kind] = (was[0] + count, min(was[1], lo), max(was[2], hi))
        if sums is not None:
            centre += sums
    return kinds, None if centre is None else centre.astype("<u8").tobytes(), string_ids


def _features_json(frame: Any, col: str) -> Any:
    """Column ``col`` of weighted features as the JSON text of an object of
    feature -> weight (a map or struct column becomes one; a string column
    is taken to hold it already)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if isinstance(frame.schema[col].dataType, T.StringType):
        return F.col(col)
    return F.to_json(F.col(col)).alias(col)
