"""The documents' feature sets and ids, kept by the fingerprint pass for the
exact check and the outputs (:class:`Spill`), as ``neardup dedup`` keeps
the sets on disk.

The fingerprint pass cuts every document's feature set to make its
summary; with a spill it also writes the sets and the ids, a few files per
byte range of the input, into a folder every executor sees (in local mode
a temporary folder of the machine; on a cluster one given with
``spill_dir``). The exact check then reads the sets of the documents it
needs instead of reading their texts again and cutting them a second time,
and the JSON Lines outputs name documents by reading their ids instead of
joining every pair with them. Shuffles nothing; the folder is removed once
the outputs are written (or the run's result is gone).
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import numpy as np

import neardup

from neardup import _neardup as _rs

from .files import write_pieces

# A document's verification summary (count, digest, MinHash sketch).
SUMMARY_BYTES = _rs.PIGEONHOLE_RECORD[2]


class Spill:
    """A folder of feature sets, ids and summaries: for byte range ``N`` of
    the input, ``N.sets`` (its documents' sets one after another, as core
    gives them), ``N.ids`` (their ids as JSON text, UTF-8, one after
    another), ``N.sums`` (their verification summaries, 144 bytes each, in
    position order) and ``N.idx`` (each document's position, the end of
    its set in ``N.sets`` and the end of its id in ``N.ids``: little-endian
    i64 triples, in position order), ``N.idx`` written last. ``starts``:
    each range's first position, ascending (range N holds the positions
    from ``starts[N]`` to the next start)."""

    def __init__(self, folder: str, starts: Any):
        self.folder = folder
        self.starts = np.asarray(starts, dtype=np.int64)

    def _path(self, index: int, kind: str) -> str:
        return os.path.join(self.folder, f"{index}.{kind}")

    def writer(self) -> "_Writer":
        """A writer for one task of the fingerprint pass."""
        return _Writer(self)

    def _by_range(self, need: Any, kind: str) -> Any:
        """For each range holding positions of ``need`` (ascending): the
        range's ``kind`` file (open), its size, and where each of its
        positions' records begins and ends there (by the index, or for
        ``sums``, whose records are of one size, by their place in it)."""
        need = np.asarray(need, dtype=np.int64)
        ranges = np.searchsorted(self.starts, need, side="right") - 1
        cuts = np.flatnonzero(np.r_[True, ranges[1:] != ranges[:-1], True]) if len(need) else np.array([0])
        column = {"sets": 1, "ids": 2, "sums": None}[kind]
        for x, y in zip(cuts[:-1], cuts[1:]):
            index = int(ranges[x])
            try:
                # Only the index's pages the positions fall in are read.
                idx = _mapped(self._path(index, "idx")).reshape(-1, 3)
                f = open(self._path(index, kind), "rb")
            except OSError as e:
                raise neardup.NeardupError(f"{self.folder}: the feature sets the fingerprint pass kept are not there ({e.strerror}); "
                                           "keep the folder until the job ends") from None
            with f:
                want = need[x:y]
                at = np.searchsorted(idx[:, 0], want)
                if (at >= len(idx)).any() or (idx[np.minimum(at, len(idx) - 1), 0] != want).any():
                    raise neardup.NeardupError(f"{self._path(index, 'idx')}: no feature set for a document the job needs; "
                                               "the folder changed while the job ran")
                size = os.fstat(f.fileno()).st_size
                if column is None:
                    if size % SUMMARY_BYTES:
                        raise neardup.NeardupError(f"{f.name}: {size} bytes, not a summary for each document its index lists; "
                                                   "the folder changed while the job ran")
                    begins = at * SUMMARY_BYTES
                    ends = begins + SUMMARY_BYTES
                else:
                    ends = idx[at, column]
                    begins = np.where(at > 0, idx[np.maximum(at - 1, 0), column], 0)
                if size < (int(ends.max()) if len(ends) else 0):
                    raise neardup.NeardupError(f"{self._path(index, kind)}: shorter than its index says; the folder changed while the job ran")
                yield f, size, begins, ends

    def drop_sets(self) -> None:
        """Removes the feature sets and summaries, keeping the ids."""
        for name in os.listdir(self.folder):
            if name.endswith((".sets", ".sums")):
                os.remove(os.path.join(self.folder, name))

    def sets_at(self, need: Any) -> list:
        """The feature sets of the documents at positions ``need``
        (ascending), one each, as bytes."""
        import mmap

        out: list = []
        for f, size, begins, ends in self._by_range(need, "sets"):
            if size == 0:
                out += [b""] * len(ends)
                continue
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                out += [m[b:e] for b, e in zip(begins.tolist(), ends.tolist())]
        return out

    def ids_at(self, need: Any) -> Any:
        """The ids (JSON text) of the documents at positions ``need``
        (ascending), one each, as an Arrow string array."""
        import pyarrow as pa

        data, lengths = [], []
        for f, size, begins, ends in self._by_range(need, "ids"):
            # Only the pages of the ids asked are read.
            raw = np.memmap(f, dtype=np.uint8, mode="r", shape=(size,)) if size else np.zeros(0, dtype=np.uint8)
            n = ends - begins
            # Each id's bytes, gathered at once.
            at = np.repeat(begins - np.r_[0, np.cumsum(n)[:-1]], n) + np.arange(int(n.sum()))
            data.append(np.asarray(raw[at]))
            lengths.append(n)
        n = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
        offsets = np.r_[0, np.cumsum(n)].astype(np.int64)
        values = np.concatenate(data) if data else np.zeros(0, dtype=np.uint8)
        return pa.LargeStringArray.from_buffers(len(n), pa.py_buffer(offsets), pa.py_buffer(values)).cast(pa.string())

    def summaries_at(self, need: Any) -> bytes:
        """The summaries of the documents at positions ``need`` (ascending
        i64, or their bytes), one after another."""
        if isinstance(need, bytes):
            need = np.frombuffer(need, dtype="<i8")
        out = []
        for f, size, begins, _ in self._by_range(need, "sums"):
            if len(begins):
                out.append(np.memmap(f, dtype=np.uint8, mode="r", shape=(size // SUMMARY_BYTES, SUMMARY_BYTES))[begins // SUMMARY_BYTES])
        return b"".join(x.tobytes() for x in out)


def _mapped(path: str) -> Any:
    """File ``path`` as little-endian i64, mapped (read as it is touched)."""
    if os.path.getsize(path) == 0:
        return np.zeros(0, dtype="<i8")
    return np.memmap(path, dtype="<i8", mode="r")


class _Writer:
    """Writes one task's ranges: the sets and ids of each batch appended to
    its range's files (a batch holds lines of one range), the index when
    the range ends. Files are written under temporary names and renamed, so
    a retried task rewrites a range whole."""

    def __init__(self, spill: Spill):
        self.spill = spill
        self.index = -1
        self.files: Any = None
        self.tmp = ""
        self.pos: list = []
        self.ends: list = []
        self.id_ends: list = []
        self.at = 0
        self.id_at = 0

    def add(self, pos: Any, sets: bytes, ends: Any, ids: Any = None, summaries: Any = None) -> None:
        """The sets, ids and summaries of documents at positions ``pos``
        (ascending, of one range): ``sets`` one after another, each ending
        at ``ends``; ``ids`` their JSON text (an Arrow string array; None:
        none kept); ``summaries`` theirs, one after another (None: none
        kept)."""
        import pyarrow as pa

        if not len(pos):
            return
        index = int(np.searchsorted(self.spill.starts, pos[0], side="right") - 1)
        if index != self.index:
            self.close()
            self.index, self.tmp = index, uuid.uuid4().hex
            self.files = tuple(open(self.spill._path(index, f"{kind}.{self.tmp}"), "wb") for kind in ("sets", "ids", "sums"))
        write_pieces(self.files[0], sets)
        if summaries is not None:
            if len(summaries) != len(pos) * SUMMARY_BYTES:
                raise ValueError(f"{len(summaries)} bytes of summaries for {len(pos)} documents")
            write_pieces(self.files[2], summaries)
        self.pos.append(np.asarray(pos, dtype=np.int64))
        self.ends.append(self.at + np.asarray(ends, dtype=np.int64))
        self.at += len(sets)
        if ids is None:
            self.id_ends.append(np.full(len(pos), self.id_at, dtype=np.int64))
            return
        ids = ids.cast(pa.large_string())
        offsets = np.frombuffer(ids.buffers()[1], dtype="<i8")[ids.offset : ids.offset + len(ids) + 1]
        if offsets[-1] > offsets[0]:
            write_pieces(self.files[1], memoryview(ids.buffers()[2])[offsets[0] : offsets[-1]])
        self.id_ends.append(self.id_at + offsets[1:] - offsets[0])
        self.id_at += int(offsets[-1] - offsets[0])

    def close(self) -> None:
        """Finishes the range being written."""
        if self.files is None:
            return
        for f in self.files:
            f.close()
        index, tmp = self.index, self.tmp
        idx = np.column_stack([np.concatenate(self.pos), np.concatenate(self.ends), np.concatenate(self.id_ends)]).astype("<i8")
        idx.tofile(self.spill._path(index, f"idx.{tmp}"))
        for kind in ("sets", "ids", "sums", "idx"):
            os.replace(self.spill._path(index, f"{kind}.{tmp}"), self.spill._path(index, kind))
        self.files, self.pos, self.ends, self.id_ends, self.at, self.id_at = None, [], [], [], 0, 0
