"""Writing the outputs: DIR/pairs, DIR/clusters, DIR/deduped and
DIR/annotated (:func:`write`).

Reads the result's DataFrames. Shuffles nothing of its own (Spark's
writers run the plans the earlier stages left). Writes Parquet, or JSON
Lines; JSON Lines records as the lines they were, by the executors
straight into the output folder when they read the input themselves
(:func:`_write_lines_local`, no pass through the JVM).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from neardup import _neardup as _rs

from .files import write_pieces
from .read import _POS_SHIFT, LocalSplits, _file_key, _read_range, _without_newlines
from .result import SparkDedupResult


def _write_lines_local(spark: Any, splits: LocalSplits, kept: Any, folder: str, frame: Any = None, removed: Any = None) -> None:
    """Writes the kept lines into ``folder`` on the local (or shared) file
    system, one ``part-NNNNN.txt`` per byte range in input order, each line
    ending in a newline, from the executors' own reads: the records never
    pass through the JVM. The parts are written into a new folder beside
    ``folder``, which replaces it (with a ``_SUCCESS`` mark) once all are
    there; a part is renamed into place when whole, so a retried task
    rewrites it. ``frame``: the ranges (:meth:`LocalSplits.frame`) with a
    column ``gone`` of each one's removed positions, passed to ``kept``
    with each batch. ``kept`` None: the ranges' lines are copied by core
    (``write_kept_lines``) minus those removed: the ``gone`` column's, else
    those of ``removed`` (a broadcast array of positions, ascending), and
    minus blank lines; only new records are kept."""
    import os
    import uuid

    import pyarrow as pa
    from pyspark.sql import types as T

    ranges = frame if frame is not None else splits.frame(spark)
    with_gone = frame is not None

    def run(tmp):
        def write_parts(batches):
            for b in batches:
                cols = [b.column(c).to_pylist() for c in ("path", "rank", "start", "end", "new", "index")]
                gones = b.column("gone").to_pylist() if with_gone else [None] * b.num_rows
                for path, rank, start, end, new, index, gone in zip(*cols, gones):
                    name = os.path.join(tmp, f"part-{index:05d}.txt")
                    part = f"{name}.{uuid.uuid4().hex}"
                    rows = 0
                    if kept is None:
                        if gone is None and removed is not None:
                            at = np.searchsorted(removed.value, [(rank << _POS_SHIFT) | start, (rank << _POS_SHIFT) | end])
                            gone = removed.value[at[0] : at[1]]
                        if new:
                            rows = _rs.write_kept_lines(_file_key(path), start, end, rank << _POS_SHIFT,
                                                        np.asarray(gone if gone is not None else [], dtype="<i8").tobytes(), part)
                        else:
                            open(part, "wb").close()
                    else:
                        with open(part, "wb") as f:
                            for lines_batch in _read_range(path, rank, start, end, new, False, 16 << 20):
                                lines = kept(lines_batch, gone) if with_gone else kept(lines_batch)
                                if lines is not None:
                                    write_pieces(f, _with_newlines(lines))
                                    rows += len(lines)
                    os.replace(part, name)
                    yield pa.RecordBatch.from_arrays([pa.array([rows], pa.int64())], names=["rows"])

        schema = T.StructType([T.StructField("rows", T.LongType(), False)])
        ranges.mapInArrow(write_parts, schema).collect()

    _into_folder(folder, run)


def _into_folder(folder: str, fill: Any) -> None:
    """Runs ``fill(tmp)``, which writes parts into a new folder ``tmp``
    beside ``folder`` on the local (or shared) file system, then puts it in
    place of ``folder`` with a ``_SUCCESS`` mark; on an error the new
    folder is removed and ``folder`` left as it was."""
    import os
    import shutil
    import uuid

    final = _file_key(folder)
    tmp = f"{final.rstrip('/')}.tmp-{uuid.uuid4().hex}"
    os.makedirs(tmp)
    try:
        fill(tmp)
        open(os.path.join(tmp, "_SUCCESS"), "wb").close()
        if os.path.isdir(final):
            shutil.rmtree(final)
        elif os.path.exists(final):
            os.remove(final)
        os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _with_newlines(lines: Any) -> Any:
    """Lines as read (each with its line end, the file's last one perhaps
    without) as bytes, each ending in one "\\n": the lines' own bytes
    where every one ends in "\\n" alone (nearly always), else rebuilt."""
    import pyarrow as pa

    n = len(lines)
    offs = np.frombuffer(lines.buffers()[1], dtype=np.int32)[lines.offset : lines.offset + n + 1].astype(np.int64)
    data = np.frombuffer(lines.buffers()[2], dtype=np.uint8)
    ends = offs[1:]
    last = data[ends - 1]  # kept lines are not blank, so never empty
    before = data[np.maximum(ends - 2, offs[:-1])]
    if (last == 10).all() and not ((before == 13) & (ends - 2 >= offs[:-1])).any():
        return memoryview(data[offs[0] : offs[-1]])
    stripped = _without_newlines(lines)
    return b"".join(x + b"\n" for x in stripped.cast(pa.binary()).to_pylist())


def write(result: SparkDedupResult, output: str, fmt: str = "parquet") -> dict:
    """Writes DIR/pairs, DIR/clusters, DIR/deduped and, with annotations,
    DIR/annotated (JSON Lines records stay the lines they were with
    ``jsonl``, annotated ones with the three fields appended; with
    ``parquet`` they become columns). The records first, then the pairs
    and the clusters at once (the few tasks of the jobs that name them
    leave cores idle). Returns the seconds each took (the last two
    overlap); raises the first error, once every writer has stopped."""
    from pyspark import InheritableThread

    if fmt not in ("parquet", "jsonl"):
        raise ValueError(f"format {fmt!r}: use parquet or jsonl")
    local = {"deduped": result.write_local, "annotated": result.write_annotated_local}
    named = {"pairs": result.write_pairs_local, "clusters": result.write_clusters_local}

    def one(name, frame):
        on_disk = "://" not in output or output.startswith("file:")
        if fmt == "jsonl" and on_disk and named.get(name) is not None and named[name](f"{output}/{name}"):
            return
        if name in local and result.json_records:
            if fmt == "jsonl" and local[name] is not None and on_disk:
                local[name](f"{output}/{name}")
                return
            if fmt == "jsonl":
                frame.write.mode("overwrite").text(f"{output}/{name}")
                return
            frame = _parse_json(frame)
        w = frame.write.mode("overwrite")
        if fmt == "parquet":
            w.parquet(f"{output}/{name}")
        else:
            w.json(f"{output}/{name}")

    took: dict = {}
    errors: list = []

    def timed(name, frame):
        t = time.monotonic()
        try:
            one(name, frame)
        except BaseException as e:  # noqa: BLE001 - raised by the caller's thread
            errors.append(e)
        took[name] = time.monotonic() - t

    outputs = [(n, f) for n, f in [("pairs", result.pairs), ("clusters", result.clusters), ("deduped", result.deduped),
                                   ("annotated", result.annotated)] if f is not None]
    # The records first, each job with every core (their tasks are long and
    # Spark runs the first job's first), then the pairs and clusters at once.
    records = [o for o in outputs if o[0] in local]
    for o in records:
        timed(*o)
        if errors:
            raise errors[0]
    threads = [InheritableThread(target=timed, args=o) for o in outputs if o[0] not in local]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return {n: took[n] for n, _ in outputs}


def _parse_json(lines: Any) -> Any:
    """JSON Lines records (one string column) as a DataFrame of their fields."""
    from pyspark.sql import DataFrame

    spark = lines.sparkSession
    col = lines.columns[0]
    try:
        jvm = spark._jvm
        strings = getattr(lines.select(col)._jdf, "as")(jvm.org.apache.spark.sql.Encoders.STRING())
        return DataFrame(spark._jsparkSession.read().json(strings), spark)
    except Exception:  # Spark Connect: no JVM handle
        return spark.read.json(lines.rdd.map(lambda r: r[0]))
