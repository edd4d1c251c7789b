"""Writing a large buffer to a file in pieces (:func:`write_pieces`)."""

from __future__ import annotations

from typing import Any

#: Bytes handed to one ``write`` call at most. A buffered write of many
#: megabytes at once can be an order of magnitude slower than the same bytes
#: in pieces of a megabyte: Linux may fill the page cache with large folios
#: for it, whose memory a virtual machine's host must first provide (on the
#: 2-core machine of docs/performance.md, 576 MB written in 8 MB calls took
#: 1.4-4.7 s in five runs of seven, in 1 MB calls 0.15-0.18 s in every run).
WRITE_PIECE = 1 << 20


def write_pieces(f: Any, data: Any) -> None:
    """Writes the bytes-like ``data`` to the binary file ``f``, at most
    :data:`WRITE_PIECE` bytes a call."""
    view = memoryview(data)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    for at in range(0, len(view), WRITE_PIECE):
        f.write(view[at : at + WRITE_PIECE])
