"""The documents' feature sets, kept by the fingerprint pass for the exact
check (:class:`Spill`), as ``neardup dedup`` keeps them on disk.

The fingerprint pass cuts every document's feature set to make its
summary; with a spill it also writes the sets, one pair of files per byte
range of the input, into a folder every executor sees (in local mode a
temporary folder of the machine; on a cluster one given with
``spill_dir``). The exact check then reads the sets of the documents it
needs instead of reading their texts again and cutting them a second time.
Shuffles nothing; the folder is removed when the job's stages are done.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import numpy as np

import neardup


class Spill:
    """A folder of feature sets: for byte range ``N`` of the input,
    ``N.sets`` (its documents' sets one after another, as core gives them)
    and ``N.idx`` (each document's position and the end of its set in
    ``N.sets``, little-endian i64 pairs, in position order), ``N.idx``
    written last. ``starts``: each range's first position, ascending
    (range N holds the positions from ``starts[N]`` to the next start)."""

    def __init__(self, folder: str, starts: Any):
        self.folder = folder
        self.starts = np.asarray(starts, dtype=np.int64)

    def _path(self, index: int, kind: str) -> str:
        return os.path.join(self.folder, f"{index}.{kind}")

    def writer(self) -> "_Writer":
        """A writer for one task of the fingerprint pass."""
        return _Writer(self)

    def sets_at(self, need: Any) -> list:
        """The feature sets of the documents at positions ``need``
        (ascending), one each, as bytes."""
        import mmap

        need = np.asarray(need, dtype=np.int64)
        ranges = np.searchsorted(self.starts, need, side="right") - 1
        cuts = np.flatnonzero(np.r_[True, ranges[1:] != ranges[:-1], True]) if len(need) else np.array([0])
        out: list = []
        for x, y in zip(cuts[:-1], cuts[1:]):
            index = int(ranges[x])
            try:
                idx = np.fromfile(self._path(index, "idx"), dtype="<i8").reshape(-1, 2)
                f = open(self._path(index, "sets"), "rb")
            except OSError as e:
                raise neardup.NeardupError(f"{self.folder}: the feature sets the fingerprint pass kept are not there ({e.strerror}); "
                                           "keep the folder until the job ends") from None
            want = need[x:y]
            at = np.searchsorted(idx[:, 0], want)
            if (at >= len(idx)).any() or (idx[np.minimum(at, len(idx) - 1), 0] != want).any():
                raise neardup.NeardupError(f"{self._path(index, 'idx')}: no feature set for a document the exact check needs; "
                                           "the folder changed while the job ran")
            ends = idx[at, 1]
            begins = np.where(at > 0, idx[np.maximum(at - 1, 0), 1], 0)
            with f:
                size = os.fstat(f.fileno()).st_size
                if size < (int(ends.max()) if len(ends) else 0):
                    raise neardup.NeardupError(f"{self._path(index, 'sets')}: shorter than its index says; the folder changed while the job ran")
                if size == 0:
                    out += [b""] * len(want)
                    continue
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                    out += [m[b:e] for b, e in zip(begins.tolist(), ends.tolist())]
        return out


class _Writer:
    """Writes one task's ranges: the sets of each batch appended to its
    range's file (a batch holds lines of one range), the index when the
    range ends. Files are written under temporary names and renamed, so a
    retried task rewrites a range whole."""

    def __init__(self, spill: Spill):
        self.spill = spill
        self.index = -1
        self.file: Any = None
        self.tmp = ""
        self.pos: list = []
        self.ends: list = []
        self.at = 0

    def add(self, pos: Any, sets: bytes, ends: Any) -> None:
        """The sets of documents at positions ``pos`` (ascending, of one
        range): ``sets`` one after another, each ending at ``ends``."""
        if not len(pos):
            return
        index = int(np.searchsorted(self.spill.starts, pos[0], side="right") - 1)
        if index != self.index:
            self.close()
            self.index, self.tmp = index, uuid.uuid4().hex
            self.file = open(self.spill._path(index, f"sets.{self.tmp}"), "wb")
        self.file.write(sets)
        self.pos.append(np.asarray(pos, dtype=np.int64))
        self.ends.append(self.at + np.asarray(ends, dtype=np.int64))
        self.at += len(sets)

    def close(self) -> None:
        """Finishes the range being written."""
        if self.file is None:
            return
        self.file.close()
        index, tmp = self.index, self.tmp
        idx = np.column_stack([np.concatenate(self.pos), np.concatenate(self.ends)]).astype("<i8")
        idx.tofile(self.spill._path(index, f"idx.{tmp}"))
        os.replace(self.spill._path(index, f"sets.{tmp}"), self.spill._path(index, "sets"))
        os.replace(self.spill._path(index, f"idx.{tmp}"), self.spill._path(index, "idx"))
        self.file, self.pos, self.ends, self.at = None, [], [], 0
