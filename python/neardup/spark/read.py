"""Reading the input: rows in input order.

:func:`read_records` reads files as the command line does: JSON Lines
lines or Parquet rows, numbered ``file rank << 40 | byte offset`` (or
``| row``) in each pass by :class:`Positions`, without a pass of its own.
Uncompressed JSON Lines files every executor sees are read by the
executors' Python workers themselves, in byte ranges (:class:`LocalSplits`,
:func:`read_ranges`), and single lines at their offsets
(:func:`read_lines_at`). Shuffles nothing; writes nothing.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

import neardup

from .tasks import task_count


_POS_SHIFT = 40  # _pos = file rank << 40 | byte offset (or row) in the file


# Added to the positions of new documents given as a DataFrame with against,
# so that the old ones come first (as files given with --against do).
NEW_AFTER = 1 << 62


def _file_key(path: str) -> str:
    """A file's path as Spark names it in ``inputFiles()`` and ``_metadata``."""
    from urllib.parse import unquote, urlparse

    u = urlparse(path)
    return unquote(u.path) if u.scheme in ("", "file") else path


class Positions:
    """Input order of rows read from files: ``file rank << 40 | byte offset``
    of a JSON Lines record in its (uncompressed) file, or ``| row`` of a
    Parquet row. It depends only on the files, not on how Spark splits them,
    so every pass over the input finds the same positions; it is computed
    in the Python worker of each pass, from the rows' ``_file`` and ``_start``
    (split start) or ``_row`` columns, with no pass of its own."""

    def __init__(self, ranks: dict, parquet: bool):
        self.ranks = ranks
        self.parquet = parquet

    def __call__(self, b: Any, state: dict) -> Any:
        """Positions of batch ``b``; ``state`` carries a split's running
        offset from one batch of a partition to the next."""
        if "_pos" in b.schema.names:
            return b.column("_pos").to_numpy()
        files = b.column("_file").dictionary_encode()
        rank = np.array([self.ranks[_file_key(f)] for f in files.dictionary.to_pylist()], dtype=np.int64)
        rank = rank[files.indices.to_numpy()] << _POS_SHIFT
        if self.parquet:
            return rank | b.column("_row").to_numpy().astype(np.int64)
        values = b.column("value")
        offs = np.frombuffer(values.buffers()[1], dtype=np.int32)[values.offset : values.offset + len(values) + 1]
        lengths = np.diff(offs).astype(np.int64) + 1  # the line and its newline
        starts = b.column("_start").to_numpy()
        split = rank | starts  # distinct per split (a start is below 2^40)
        pos = np.empty(len(values), dtype=np.int64)
        cuts = np.flatnonzero(np.r_[True, split[1:] != split[:-1], True])
        for x, y in zip(cuts[:-1], cuts[1:]):
            # A run of rows of one split: offsets from where the split stands.
            key = int(split[x])
            at = state[1] if state.get(0) == key else int(starts[x])
            run = np.cumsum(lengths[x:y]) - lengths[x:y] + at
            pos[x:y] = rank[x] | run
            state[0], state[1] = key, int(run[-1] + lengths[y - 1])
        return pos


def read_records(spark: Any, paths: list, fmt: str, against: Optional[list] = None) -> tuple:
    """The input as the command line reads it: one row per JSON Lines record
    (``value``, the line unchanged) or per Parquet row, with ``_new`` (false
    for ``against``'s documents, which come first) and what :class:`Positions`
    needs to number them in input order (files in the order given, folders'
    files by name, then line or row order). Returns (DataFrame, Positions,
    LocalSplits or None): uncompressed JSON Lines files on a local or shared
    file system are read by the executors themselves (:class:`LocalSplits`;
    ``NEARDUP_SPARK_READER=spark`` reads them through Spark instead)."""
    import os

    from pyspark.sql import functions as F

    local = _local_files(against or []), _local_files(paths)
    if fmt != "parquet" and None not in local and os.environ.get("NEARDUP_SPARK_READER") != "spark":
        # Plain local files, named one by one: no listing job.
        ranks: dict = {}
        for f in local[0] + local[1]:
            ranks.setdefault(f, len(ranks))
        if LocalSplits.eligible(list(ranks)):
            return _read_locally(spark, ranks, set(local[1]))
    frames, ranks = [], {}
    for new, group in [(False, against or []), (True, paths)]:
        if not group:
            continue
        frame = spark.read.parquet(*group) if fmt == "parquet" else spark.read.text(group)
        files = sorted(frame.inputFiles(), key=_file_key) if len(group) == 1 else _ordered(frame.inputFiles(), group)
        for f in files:
            ranks.setdefault(_file_key(f), len(ranks))
        if fmt == "parquet":
            frame = frame.select("*", F.col("_metadata.file_path").alias("_file"), F.col("_metadata.row_index").alias("_row"))
        else:
            frame = frame.select("value", F.col("_metadata.file_path").alias("_file"), F.col("_metadata.file_block_start").alias("_start"))
        frames.append(frame.withColumn("_new", F.lit(new)))
    if len(ranks) >= 1 << (63 - _POS_SHIFT):
        raise neardup.NeardupError(f"{len(ranks)} input files: at most {1 << (63 - _POS_SHIFT)}")
    positions = Positions(ranks, fmt == "parquet")
    if fmt != "parquet" and LocalSplits.eligible(list(ranks)) and os.environ.get("NEARDUP_SPARK_READER") != "spark":
        return _read_locally(spark, ranks, set(_file_key(f) for f in (frames[-1].inputFiles() if paths else [])))
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f)
    return out, positions, None


def _read_locally(spark: Any, ranks: dict, news: set) -> tuple:
    """:func:`read_records`' answer for uncompressed JSON Lines files
    ``ranks`` (file -> rank) read by the executors themselves; ``news``: the
    files of new documents (not ``against``'s)."""
    files = [(f, r, f in news) for f, r in sorted(ranks.items(), key=lambda x: x[1])]
    splits = LocalSplits(files, spark.sparkContext.defaultParallelism)
    return splits.records(spark), Positions(ranks, False), splits


def _local_files(paths: list) -> Optional[list]:
    """``paths`` as Spark's listing names them (:func:`_file_key`), in the
    order given, if every one is a regular local file (not a folder, a glob,
    a hidden file or a URL other than ``file:``), else None."""
    import os

    out = []
    for p in paths:
        if "://" in p and not p.startswith("file:"):
            return None
        local = os.path.abspath(_file_key(p))
        if not os.path.isfile(local) or any(c in p for c in "*?[{") or os.path.basename(local)[:1] in ("_", "."):
            return None  # Spark lists globs, and leaves hidden files out
        out.append(local)
    return out


_BOM = b"\xef\xbb\xbf"  # the UTF-8 byte-order mark


# Compressions Spark (Hadoop) recognises by a file's extension: such files are
# read through Spark, which decompresses them.
_COMPRESSED = (".gz", ".bz2", ".zst", ".zstd", ".deflate", ".lz4", ".snappy", ".xz", ".br")


class LocalSplits:
    """JSON Lines files on a file system every executor sees at the same path
    (local mode, or a mount shared by the cluster), read by the executors'
    Python workers themselves in byte ranges: the texts never pass through
    the JVM (which, turning lines into Arrow batches, used most of a core),
    and the exact check reads only the lines it needs, at their offsets. A
    line belongs to the range holding its first byte; its position is ``file
    rank << 40 | byte offset``, as :class:`Positions` numbers lines read by
    Spark. A UTF-8 byte-order mark before a file's first line is not part of
    the record (as ``neardup dedup`` reads it): that line's position is the
    byte after it."""

    smallest = 8 << 20  # bytes: the smallest range (tests lower it)

    def __init__(self, files: list, cores: int):
        import os

        # (path, rank, new) -> ranges of at most 128 MB and at least 8, at
        # least four a core and, of one file, a whole number of waves (a
        # multiple of the cores), so that the cores finish together.
        sized = [(path, rank, new, os.path.getsize(path)) for path, rank, new in files]
        total = sum(size for *_, size in sized)
        wanted = task_count(cores, max(4 * cores, -(-total // (128 << 20))))
        step = int(max(self.smallest, -(-total // wanted)))
        self.ranges = [
            (path, rank, start, min(start + step, size), new)
            for path, rank, new, size in sized
            for start in range(0, size, step)
        ]

    def paths(self) -> dict:
        """File rank -> path."""
        return {rank: path for path, rank, *_ in self.ranges}

    @staticmethod
    def eligible(files: list) -> bool:
        """Whether every file is a local (or mounted) uncompressed one."""
        return all("://" not in f or f.startswith("file:") for f in files) and not any(
            f.lower().endswith(_COMPRESSED) for f in files
        )

    def frame(self, spark: Any) -> Any:
        """One row per byte range, one range per partition. Made in the JVM:
        a range of partition numbers joined with the ranges (a local
        relation, broadcast), where a Python RDD's rows (``parallelize``)
        would need a Python worker beside each task's own to feed it."""
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        schema = T.StructType([
            T.StructField("path", T.StringType(), False),
            T.StructField("rank", T.LongType(), False),
            T.StructField("start", T.LongType(), False),
            T.StructField("end", T.LongType(), False),
            T.StructField("new", T.BooleanType(), False),
            T.StructField("index", T.LongType(), False),
        ])
        indexed = [r + (i,) for i, r in enumerate(self.ranges)]
        ranges = spark.createDataFrame(indexed, schema)
        parts = spark.range(0, len(indexed), 1, max(len(indexed), 1)).withColumnRenamed("id", "index")
        return parts.join(F.broadcast(ranges), "index").select(*schema.fieldNames())

    def map(self, spark: Any, fn: Any, schema: Any, strip: bool = False, large: bool = False) -> Any:
        """``fn`` over the input's records, as ``mapInArrow`` would run it over
        ``value``/``_pos``/``_new`` batches (``value``: the line with its
        newline, unless ``strip``; ``large``: a large string, the lines read
        and cut by core)."""

        def run(batches):
            return fn(read_ranges(batches, strip, large=large))

        return self.frame(spark).mapInArrow(run, schema)

    def records(self, spark: Any) -> Any:
        """The records as a DataFrame (``value`` without newlines, ``_pos``,
        ``_new``), for the paths that need Spark to hold them."""
        from pyspark.sql import types as T

        schema = T.StructType([
            T.StructField("value", T.StringType(), True),
            T.StructField("_pos", T.LongType(), False),
            T.StructField("_new", T.BooleanType(), False),
        ])
        return self.map(spark, lambda batches: batches, schema, strip=True)


def read_ranges(batches: Any, strip: bool = False, chunk: int = 16 << 20, large: bool = False) -> Any:
    """The records of each byte range of ``batches`` (rows of
    :meth:`LocalSplits.frame`) as Arrow batches of ``value`` (the line, with
    its newline unless ``strip``), ``_pos`` and ``_new``; ``large``: the
    lines, with their newlines, as large strings cut by core."""
    for b in batches:
        cols = [b.column(c).to_pylist() for c in ("path", "rank", "start", "end", "new")]
        for path, rank, start, end, new in zip(*cols):
            if large and not strip:
                yield from _read_range_large(path, rank, start, end, new, chunk)
            else:
                yield from _read_range(path, rank, start, end, new, strip, chunk)


def _read_range_large(path: str, rank: int, start: int, end: int, new: bool, chunk: int) -> Any:
    """:func:`_read_range`'s batches (lines with their newlines), read and cut
    by core (``range_lines``) about ``chunk`` bytes at a time, ``value`` a
    large string."""
    import pyarrow as pa

    from neardup import _neardup as _rs

    at = start
    while at < end:
        data, starts, pos, at_next = _rs.range_lines(_file_key(path), at, end, rank << _POS_SHIFT, chunk)
        n = len(pos) // 8
        if n:
            value = pa.Array.from_buffers(pa.large_string(), n, [None, pa.py_buffer(starts), pa.py_buffer(data)])
            yield pa.RecordBatch.from_arrays([value, pa.array(np.frombuffer(pos, dtype="<i8")), pa.array(np.full(n, new, dtype=bool))],
                                             names=["value", "_pos", "_new"])
        if at_next <= at:
            break
        at = at_next


def _read_range(path: str, rank: int, start: int, end: int, new: bool, strip: bool, chunk: int) -> Any:
    local = _file_key(path)
    try:
        f = open(local, "rb")
    except OSError as e:
        raise neardup.NeardupError(f"{local}: cannot read it ({e.strerror}); check the path and its permissions") from None
    with f:
        at = start
        if start > 0:
            # The line that holds byte start - 1 belongs to the range before.
            f.seek(start - 1)
            at = start - 1 + len(f.readline())
        pending = b""
        while at < end:
            data = f.read(chunk)
            eof = len(data) < chunk
            buf = pending + data if pending else data
            if not buf:
                break
            arr = np.frombuffer(buf, dtype=np.uint8)
            ends = np.flatnonzero(arr == 10) + 1
            if eof and (len(ends) == 0 or ends[-1] != len(buf)):
                ends = np.append(ends, len(buf))  # the last line, without a newline
            starts = np.r_[0, ends[:-1]] if len(ends) else ends
            n = int(np.searchsorted(at + starts, end))  # lines that start in the range
            if at == 0 and n and buf.startswith(_BOM):
                starts[0] = min(len(_BOM), int(ends[0]))  # the file's first line, after the mark
            if n:
                yield _lines_batch(buf, starts[:n], ends[:n], (rank << _POS_SHIFT) | (at + starts[:n]), new, strip)
            if n < len(ends) or eof:
                break
            consumed = int(ends[-1]) if len(ends) else 0
            pending = buf[consumed:]
            at += consumed


def _without_newlines(lines: Any) -> Any:
    """Arrow strings without their final newline ("\\n" or "\\r\\n")."""
    if not len(lines):
        return lines
    offs = np.frombuffer(lines.buffers()[1], dtype=np.int32)[lines.offset : lines.offset + len(lines) + 1].astype(np.int64)
    buf = lines.buffers()[2]
    data = memoryview(buf)[: offs[-1]] if buf is not None else b""
    return _lines_batch(data, offs[:-1], offs[1:], np.zeros(len(lines)), False, True).column("value")


def _lines_batch(buf: bytes, starts: Any, ends: Any, pos: Any, new: bool, strip: bool) -> Any:
    """Lines ``buf[starts[i]:ends[i]]`` as an Arrow batch."""
    import pyarrow as pa

    n = len(starts)
    if strip:
        # The lines are contiguous: drop each one's "\n" (and a "\r" before it).
        base = int(starts[0])
        arr = np.frombuffer(buf, dtype=np.uint8)[: int(ends[-1])]
        keep = np.ones(len(arr), dtype=bool)
        keep[:base] = False
        cut = np.zeros(n, dtype=np.int64)
        for ch in (10, 13):  # as Spark's line reader drops them
            last = ends - cut - 1
            has = (last >= starts) & (arr[np.maximum(last, 0)] == ch)
            keep[last[has]] = False
            cut += has
        data = arr[keep].tobytes()
        offsets = np.r_[0, np.cumsum(ends - starts - cut)].astype(np.int32)
    else:
        data = memoryview(buf)[: int(ends[-1])]
        offsets = np.r_[starts, ends[-1]].astype(np.int32)
    value = pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data)])
    return pa.RecordBatch.from_arrays(
        [value, pa.array(np.asarray(pos, dtype=np.int64)), pa.array(np.full(n, new, dtype=bool))],
        names=["value", "_pos", "_new"],
    )


def _ordered(files: list, given: list) -> list:
    """Input files in the command line's order: each argument in turn, a
    folder's files by name."""
    keyed = [(_file_key(f), f) for f in files]
    out = []
    for g in given:
        root = _file_key(g if "://" in g else "file://" + __import__("os").path.abspath(g)).rstrip("/")
        mine = sorted(f for f in keyed if f[0] == root or f[0].startswith(root + "/"))
        out += [f for _, f in mine if f not in out]
    out += sorted((f for _, f in keyed if f not in out), key=_file_key)
    return out


def read_lines_at(paths: dict, positions: Any) -> Any:
    """The lines (with their newlines) starting at ``positions`` (``file rank
    << 40 | byte offset``, ascending; ``paths``: rank -> file) as an Arrow
    batch of ``value``."""
    import pyarrow as pa

    mask = (1 << _POS_SHIFT) - 1
    pieces = []
    f, rank = None, None
    try:
        for p in positions.tolist():
            if p >> _POS_SHIFT != rank:
                if f is not None:
                    f.close()
                rank = p >> _POS_SHIFT
                try:
                    f = open(paths[rank], "rb")
                except OSError as e:
                    raise neardup.NeardupError(f"{paths[rank]}: cannot read it ({e.strerror})") from None
            f.seek(p & mask)
            pieces.append(f.readline())
    finally:
        if f is not None:
            f.close()
    lengths = np.fromiter((len(x) for x in pieces), dtype=np.int64, count=len(pieces))
    offsets = np.r_[0, np.cumsum(lengths)].astype(np.int32)
    value = pa.Array.from_buffers(pa.string(), len(pieces), [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"".join(pieces))])
    return pa.RecordBatch.from_arrays([value], names=["value"])
