"""neardup: near-duplicate detection with SimHash fingerprints, in Rust.

Charikar's SimHash and the permuted-table Hamming search of Manku, Jain & Das
Sarma (WWW 2007). Fingerprint texts, index fingerprints for exact lookups
within k bits, and deduplicate corpora with exact Jaccard verification.

>>> import neardup
>>> a = neardup.fingerprint("The harbour master opened the gates at dawn.")
>>> b = neardup.fingerprint("The harbour master opened the gates at dawn!")
>>> a == b
True
>>> neardup.distance(a, neardup.fingerprint("A recipe for bread and butter."), bits=64) > 3
True

Every function takes the pipeline settings as keyword arguments (``bits``,
``tokenizer``, ``features``, ``weights``, ``profile`` ...) or a ready
:class:`FingerprintConfig` as ``config``; errors are :class:`NeardupError`
(a ``ValueError``) with the Rust core's message.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _neardup as _rs
from ._neardup import ConfigError, FingerprintConfig, InputError, NeardupError

__all__ = [
    "FingerprintConfig",
    "NeardupError",
    "ConfigError",
    "InputError",
    "Index",
    "DedupResult",
    "fingerprint",
    "fingerprints",
    "fingerprint_vectors",
    "fingerprint_features",
    "vector_config",
    "distance",
    "similarity",
    "dedup",
    "to_hex",
    "plan",
    "read",
    "Documents",
]

__version__ = "0.1.0"

Id = Union[int, str]


@functools.lru_cache(maxsize=64)
def _cached_config(items: Tuple[Tuple[str, Any], ...]) -> FingerprintConfig:
    return FingerprintConfig(**dict(items))


def _config(config: Optional[FingerprintConfig], kwargs: dict) -> FingerprintConfig:
    """``config`` with the pipeline keywords given applied over it (as the
    command line's flags over ``--config``), or the keywords alone."""
    if config is not None:
        if not isinstance(config, FingerprintConfig):
            raise TypeError("config must be a neardup.FingerprintConfig")
        return _dedup_config(False, config, kwargs)[0] if kwargs else config
    return _cached_config(tuple(sorted((key, os.fspath(v) if key == "idf" else v) for key, v in kwargs.items())))


def fingerprint(text: str, config: Optional[FingerprintConfig] = None, **kwargs: Any) -> int:
    """The SimHash fingerprint of ``text``, as an int (64 or 128 bits).

    >>> neardup.fingerprint("hello world", profile="python-simhash") == __import__("simhash").Simhash("hello world").value  # doctest: +SKIP
    True
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, not {type(text).__name__}")
    return _rs.fingerprint(_config(config, kwargs), text)


def _is_arrow(x: Any) -> bool:
    mod = type(x).__module__
    return mod.startswith("pyarrow")


def _string_buffers(arr: Any) -> tuple:
    """A pyarrow string array as the Rust side reads it: offsets, data, the
    array's offset and length, whether the offsets are 64-bit, and the
    validity bitmap (None without nulls)."""
    import pyarrow as pa

    if pa.types.is_string(arr.type):
        large = False
    elif pa.types.is_large_string(arr.type):
        large = True
    else:
        raise TypeError(f"an arrow array of strings is needed, not {arr.type}")
    validity, offsets, data = arr.buffers()
    return (
        offsets.to_pybytes() if offsets is not None else b"",
        data.to_pybytes() if data is not None else b"",
        arr.offset,
        len(arr),
        large,
        validity.to_pybytes() if validity is not None and arr.null_count else None,
    )


def _arrow_chunk(cfg: FingerprintConfig, arr: Any, threads: Optional[int]) -> bytes:
    return _rs.fingerprints_arrow(cfg, *_string_buffers(arr), threads)


def fingerprints(
    texts: Union[Sequence[str], Any],
    config: Optional[FingerprintConfig] = None,
    *,
    threads: Optional[int] = None,
    output: str = "numpy",
    **kwargs: Any,
) -> Any:
    """Fingerprints of many texts, computed in parallel in Rust with the GIL
    released.

    ``texts``: a list (or any iterable) of str, or a pyarrow string array
    (``string`` or ``large_string``; chunked arrays too; nulls count as empty
    texts). Returns a numpy ``uint64`` array of shape ``(n,)``, or ``(n, 2)``
    holding (high, low) 64-bit halves for 128-bit fingerprints; with
    ``output="arrow"``, a pyarrow ``uint64`` array (a fixed-size list of two
    for 128 bits). ``threads``: worker threads (default: all cores; 1 runs on
    the calling thread only).

    >>> fps = neardup.fingerprints(["one text", "another text"])
    >>> fps.dtype, fps.shape
    (dtype('uint64'), (2,))
    """
    cfg = _config(config, kwargs)
    if _is_arrow(texts):
        import pyarrow as pa

        chunks = texts.chunks if isinstance(texts, pa.ChunkedArray) else [texts]
        raw = b"".join(_arrow_chunk(cfg, c, threads) for c in chunks)
    else:
        if isinstance(texts, str):
            raise TypeError("texts must be a sequence of str, not one str: use fingerprint()")
        texts = texts if isinstance(texts, list) else list(texts)
        raw = _rs.fingerprints_list(cfg, texts, threads)
    words = np.frombuffer(raw, dtype="<u8").astype(np.uint64, copy=False)
    if cfg.bits == 128:
        words = words.reshape(-1, 2)
    if output == "numpy":
        return words
    if output == "arrow":
        import pyarrow as pa

        if cfg.bits == 64:
            return pa.array(words, type=pa.uint64())
        return pa.FixedSizeListArray.from_arrays(pa.array(words.reshape(-1), type=pa.uint64()), 2)
    raise ValueError(f"output={output!r}: use 'numpy' or 'arrow'")


_fingerprints = fingerprints


def vector_config(bits: int = 64, dim: Optional[int] = None, seed: int = 0) -> FingerprintConfig:
    """The configuration of dense vectors (random-hyperplane SimHash) of
    ``dim`` dimensions (any, if None), as the CLI's ``--dim D --seed S``."""
    return _rs.vector_config(bits, dim, seed)


def _vector_rows(array: Any) -> Iterable[Tuple[np.ndarray, int]]:
    """Row-major float32/float64 blocks of a 2-D array or an Arrow
    fixed-size-list column, with each block's first row number."""
    if _is_arrow(array):
        import pyarrow as pa

        import pyarrow.compute as pc

        chunks = array.chunks if isinstance(array, pa.ChunkedArray) else [array]
        first = 0
        dim = None
        for chunk in chunks:
            if chunk.null_count:
                bad = first + pc.index(pc.is_null(chunk), True).as_py()
                raise NeardupError(f"row {bad}: the vector is null; drop or fill such rows")
            if pa.types.is_fixed_size_list(chunk.type):
                width = chunk.type.list_size
            elif pa.types.is_list(chunk.type) or pa.types.is_large_list(chunk.type):
                # Variable-size lists (as Spark and JSON give them): all one length.
                lengths = pc.list_value_length(chunk).to_numpy(zero_copy_only=False)
                width = int(lengths[0]) if len(lengths) else (dim or 0)
                if len(lengths) and (lengths != width).any():
                    bad = int(np.argmax(lengths != width))
                    raise NeardupError(
                        f"row {first + bad}: the vector has {lengths[bad]} dimensions, but row {first} has {width}"
                    )
            else:
                raise TypeError(f"an arrow list column of floats is needed, not {chunk.type}")
            if dim is not None and len(chunk) and width != dim:
                raise NeardupError(f"row {first}: the vector has {width} dimensions, but row 0 has {dim}")
            if len(chunk):
                dim = width
                values = chunk.flatten().to_numpy(zero_copy_only=False)
                yield from _numpy_blocks(values.reshape(-1, width), first)
            first += len(chunk)
        return
    yield from _numpy_blocks(np.asarray(array), 0)


def _numpy_blocks(a: np.ndarray, first: int, rows: int = 16384) -> Iterable[Tuple[np.ndarray, int]]:
    if a.ndim != 2:
        raise NeardupError(
            f"vectors come as a 2-D array of shape (n, d), not {a.ndim}-D "
            "(one vector: array.reshape(1, -1))"
        )
    if a.dtype not in (np.float32, np.float64):
        if not np.issubdtype(a.dtype, np.number):
            raise TypeError(f"vectors must be numbers, not {a.dtype}")
        a = a.astype(np.float32)
    for start in range(0, a.shape[0], rows):
        yield np.ascontiguousarray(a[start:start + rows]), first + start


def fingerprint_vectors(
    array: Any,
    bits: int = 64,
    seed: int = 0,
    *,
    threads: Optional[int] = None,
    config: Optional[FingerprintConfig] = None,
) -> np.ndarray:
    """Random-hyperplane SimHash fingerprints of dense vectors (embeddings):
    the Hamming distance h between two estimates their angle, pi * h / bits.

    ``array``: a 2-D NumPy array of shape (n, d) (float32 or float64; other
    numbers are converted), or a pyarrow fixed-size-list column of floats.
    Computed in Rust, in parallel, with the GIL released; the same fingerprints
    as ``neardup fingerprint`` of the same vectors with ``--bits``/``--seed``.
    Returns ``uint64`` of shape ``(n,)``, or ``(n, 2)`` (high, low) for 128
    bits. A vector with a NaN or infinite entry, or all zeros, is an error
    naming its row.

    >>> fps = neardup.fingerprint_vectors(np.eye(3, 8, dtype=np.float32))
    >>> fps.dtype, fps.shape
    (dtype('uint64'), (3,))
    """
    out = []
    cfg = None
    for block, first in _vector_rows(array):
        if cfg is None:
            cfg = config if config is not None else vector_config(bits, None, seed)
        out.append(
            _rs.fingerprints_vectors(
                cfg, block.tobytes(), block.shape[1], block.dtype == np.float64, first, threads
            )
        )
    words = np.frombuffer(b"".join(out), dtype="<u8").astype(np.uint64)
    width = cfg.bits if cfg is not None else bits
    return words.reshape(-1, 2) if width == 128 else words


def fingerprint_features(
    features: Any, bits: int = 64, seed: int = 0, hash: str = "xxh3"
) -> int:
    """The SimHash fingerprint of weighted features: a dict of feature ->
    weight (or a list of pairs), each feature hashed with ``hash`` and
    ``seed``; the same as the CLI's ``--features-field``. Weights may be
    negative; they must be finite."""
    items = list(features.items()) if isinstance(features, dict) else [(str(f), float(w)) for f, w in features]
    return _rs.fingerprint_input(_rs.features_config(bits, hash, seed), [(str(f), float(w)) for f, w in items])


def _words(fps: Any, bits: int) -> bytes:
    """Fingerprints (ints, a numpy array, or (n, 2) halves) as little-endian words."""
    if isinstance(fps, np.ndarray) and fps.dtype in (np.uint64, np.int64):
        arr = fps.astype(np.uint64, copy=False)
        if bits == 128 and arr.ndim != 2:
            raise NeardupError("128-bit fingerprints as an array come as (n, 2) (high, low) halves")
        return np.ascontiguousarray(arr, dtype="<u8").tobytes()
    ints = [int(x) for x in fps]
    if bits == 64:
        try:
            return np.array(ints, dtype=np.uint64).astype("<u8").tobytes()
        except OverflowError:
            raise NeardupError("a fingerprint does not fit in 64 bits: use bits=128") from None
    flat = []
    for x in ints:
        if x < 0 or x >> 128:
            raise NeardupError(f"fingerprint {x} does not fit in 128 bits")
        flat += [x >> 64, x & 0xFFFFFFFFFFFFFFFF]
    return np.array(flat, dtype=np.uint64).astype("<u8").tobytes()


@dataclass
class Documents:
    """Documents read from files by :func:`read`: their ids, and their
    texts (``kind == "text"``), vectors (a 2-D float array, ``"vector"``)
    or weighted features (dicts, ``"features"``)."""

    ids: List[Id]
    docs: Any
    kind: str = "text"


def _files(paths: Any) -> List[str]:
    """Files of ``paths`` (files or folders, folders read recursively in name
    order), as the command line lists its inputs."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out = []
    for p in map(os.fspath, paths):
        if os.path.isdir(p):
            for root, dirs, files in os.walk(p):
                dirs.sort()
                out += [os.path.join(root, f) for f in sorted(files)]
        elif os.path.exists(p):
            out.append(p)
        else:
            raise InputError(f"{p}: no such file or folder")
    return out


def _open_text(path: str) -> Any:
    if path.endswith((".gz", ".gzip")):
        import gzip

        return gzip.open(path, "rt", encoding="utf-8")
    if path.endswith((".zst", ".zstd")):
        try:
            import zstandard
        except ImportError:
            raise InputError(f"{path}: reading zstd needs the zstandard package (pip install zstandard)") from None
        import io

        return io.TextIOWrapper(zstandard.open(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")


def read(
    paths: Any,
    *,
    text_field: str = "text",
    id_field: str = "id",
    vector_field: Optional[str] = None,
    features_field: Optional[str] = None,
    skip_invalid: bool = False,
) -> Documents:
    """Documents from files as ``neardup dedup`` and ``fingerprint`` read
    them: JSON Lines (``.jsonl``, ``.json``, also ``.gz``; ``.zst`` with the
    zstandard package), Parquet (``.parquet``, with pyarrow) and NumPy
    ``.npy`` (one vector per row); folders recursively in name order. Ids
    are the records' ``id_field``, else the line number (from 1, blank lines
    counted), the Parquet row (from 1) or the ``.npy`` row (from 0), and
    ``FILE:N`` when several files are read. ``vector_field`` or
    ``features_field`` read dense vectors or weighted features instead of
    texts. A malformed record is an :class:`InputError` naming the file and
    line, unless ``skip_invalid``. Give the result's ``docs`` and ``ids`` to
    :func:`dedup` (``vectors=`` or ``weighted=`` by ``kind``)."""
    import json

    files = _files(paths)
    several = len(files) > 1
    kind = "vector" if vector_field else "features" if features_field else "text"
    field_name = vector_field or features_field or text_field
    ids: List[Id] = []
    docs: list = []

    def default(path: str, n: int) -> Id:
        return f"{path}:{n}" if several else n

    for path in files:
        name = path[: -len(os.path.splitext(path)[1])] if path.endswith((".gz", ".gzip", ".zst", ".zstd")) else path
        if name.endswith(".npy"):
            rows = np.load(path)
            if rows.ndim != 2:
                raise InputError(f"{path}: a .npy file of vectors is 2-D (rows of one dimension), not {rows.ndim}-D")
            ids += [default(path, i) for i in range(len(rows))]
            docs += list(rows)
            kind = "vector"
            continue
        if name.endswith(".parquet"):
            import pyarrow.parquet as pq

            table = pq.read_table(path)
            if field_name not in table.column_names:
                raise InputError(f"{path}: no column {field_name!r} (columns: {table.column_names}); name it with text_field=")
            values = table.column(field_name).to_pylist()
            got = table.column(id_field).to_pylist() if id_field in table.column_names else [None] * len(values)
            for row, (v, i) in enumerate(zip(values, got), start=1):
                if v is None:
                    if skip_invalid:
                        continue
                    raise InputError(f"{path}: row {row}: the text (column {field_name!r}) is null; drop or fill such rows, or pass skip_invalid=True")
                ids.append(i if i is not None else default(path, row))
                docs.append(v)
            continue
        with _open_text(path) as f:
            for line_no, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                    if not isinstance(record, dict):
                        raise ValueError("not a JSON object")
                    value = record.get(field_name)
                    if value is None:
                        raise ValueError(f"no {field_name!r} field")
                    if kind == "text" and not isinstance(value, str):
                        raise ValueError(f"the {field_name!r} field is not a string")
                except ValueError as e:
                    if skip_invalid:
                        continue
                    raise InputError(f"{path}: line {line_no}: {e}; fix the record, or pass skip_invalid=True") from None
                i = record.get(id_field)
                ids.append(i if isinstance(i, (int, str)) and not isinstance(i, bool) else default(path, line_no))
                docs.append(value)
    if kind == "vector":
        docs = np.asarray(docs, dtype=np.float32).reshape(len(docs), -1) if docs else np.zeros((0, 0), np.float32)
    return Documents(ids=ids, docs=docs, kind=kind)


def plan(n: float, k: int = 3, bits: int = 64, memory: Optional[float] = None) -> dict:
    """The table design ``neardup plan`` chooses for ``n`` fingerprints of
    ``bits`` bits searched within ``k`` (within ``memory`` bytes of tables,
    if given): ``{"chosen": {...}, "reason": str, "options": [...]}``, each
    design with its tables, expected candidates per query, estimated query
    time and memory."""
    return _rs.plan(float(n), k, bits, memory)


def distance(a: int, b: int, bits: int = 64) -> int:
    """Hamming distance between two fingerprints of ``bits`` bits."""
    return _rs.distance(a, b, bits)


def similarity(a: int, b: int, bits: int = 64) -> float:
    """Estimated cosine similarity of the feature vectors, cos(pi * d / f)."""
    return _rs.similarity(a, b, bits)


def to_hex(fp: int, bits: int = 64) -> str:
    """A fingerprint as the hex digits neardup's command line prints."""
    return format(fp, f"0{bits // 4}x")


class Index:
    """An exact Hamming-distance index (permuted tables, the paper's section 3):
    every stored fingerprint within k of a query, nothing missed.

    >>> idx = neardup.Index.build([0b1011, 0b1010, 1 << 40], ids=["a", "b", "c"], k=2)
    >>> idx.query(0b1011)
    [('a', 0), ('b', 1)]

    Files are the command line's format (``neardup index build``/``query``).
    """

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    @classmethod
    def build(
        cls,
        fingerprints: Any = None,
        ids: Optional[Sequence[Id]] = None,
        *,
        k: int = 3,
        bits: Optional[int] = None,
        config: Optional[FingerprintConfig] = None,
        vectors: Any = None,
        seed: int = 0,
        texts: Any = None,
        compressed: bool = False,
        coding: str = "elias-fano",
        block_bytes: int = 1024,
    ) -> "Index":
        """Builds an index of ``fingerprints`` (ints, or an array from
        :func:`fingerprints`) with their ``ids`` (ints or strs; default
        positions). ``config``: how the fingerprints were made, kept in the
        file and used by text queries; it must be the configuration that made
        them, or text queries miss. ``k``: the largest query distance.

        ``texts``: texts instead (a list of str or a pyarrow string array),
        fingerprinted here with ``config`` (default: :class:`FingerprintConfig`'s
        defaults, at ``bits`` if given), so that the index and its text queries
        use one configuration by construction.

        ``vectors``: dense vectors instead (a 2-D array or an Arrow
        fixed-size-list column), fingerprinted with ``bits`` (default 64) and
        ``seed``; the index then answers queries by vector.

        ``compressed=True``: compressed tables, as ``neardup index build
        --compressed`` (``coding`` "elias-fano" or "gaps", blocks of about
        ``block_bytes`` bytes of keys): smaller, read-only, saved and loaded
        like plain ones."""
        if texts is not None:
            if fingerprints is not None or vectors is not None:
                raise TypeError("give one of fingerprints, texts= and vectors=")
            if config is None:
                config = FingerprintConfig(bits=bits) if bits is not None else FingerprintConfig()
            elif bits is not None and bits != config.bits:
                raise NeardupError(f"bits={bits} contradicts the configuration's {config.bits} bits")
            fingerprints = globals()["fingerprints"](texts, config)
            bits = config.bits
            if _is_arrow(texts):
                texts = texts.to_pylist()
            texts = ["" if t is None else t for t in texts]
        if vectors is not None:
            if fingerprints is not None:
                raise TypeError("give fingerprints or vectors=, not both")
            first = next(_vector_rows(vectors), None)
            dim = first[0].shape[1] if first is not None else None
            if config is None:
                config = vector_config(bits or 64, dim, seed)
            fingerprints = fingerprint_vectors(vectors, config=config)
            bits = config.bits
        if fingerprints is None:
            raise TypeError("give fingerprints or vectors=")
        if bits is None:
            bits = config.bits if config is not None else (128 if isinstance(fingerprints, np.ndarray) and fingerprints.ndim == 2 else 64)
        data = _words(fingerprints, bits)
        built = cls(_rs._Index.build(data, bits, k, list(ids) if ids is not None else None, config, None,
                                     compressed, coding, block_bytes))
        if texts is not None:
            built._inner.set_sketches(texts)
        return built

    @classmethod
    def load(cls, path: Union[str, os.PathLike]) -> "Index":
        """Opens an index file, plain or compressed, memory-mapped (its tables
        are used in place, not read into memory)."""
        return cls(_rs._Index.load(os.fspath(path)))

    def save(self, path: Union[str, os.PathLike]) -> None:
        """Writes the index file atomically: to a synced temporary file beside
        it, then renamed into place."""
        self._inner.save(os.fspath(path))

    @property
    def k(self) -> int:
        """The largest distance queries may ask for."""
        return self._inner.k

    @property
    def bits(self) -> int:
        return self._inner.bits

    @property
    def compressed(self) -> bool:
        """Whether the tables are compressed (``neardup index build
        --compressed``): queried in place, read-only."""
        return self._inner.compressed

    @property
    def config(self) -> Optional[FingerprintConfig]:
        """The fingerprint configuration stored with the index, if any."""
        return self._inner.config

    def __len__(self) -> int:
        return len(self._inner)

    def __repr__(self) -> str:
        return f"Index({len(self)} fingerprints, {self.bits} bits, k <= {self.k})"

    def _fp(self, x: Any) -> int:
        if isinstance(x, (str, list, tuple, np.ndarray)):
            cfg = self.config
            if cfg is None:
                raise NeardupError("this index has no configuration: query it with fingerprints")
            if isinstance(x, np.ndarray):
                x = x.astype(np.float32).tolist()
            return _rs.fingerprint_input(cfg, x)
        return int(x)

    def query(self, x: Any, k: Optional[int] = None, verify: Optional[float] = None) -> List[Tuple[Any, ...]]:
        """``[(id, distance)]`` of every entry within ``k`` (default: the
        index's k) of a fingerprint, a text, or a vector (an index of
        vectors), nearest first.

        ``verify=T`` (a text query, an index built from ``texts=``): only the
        entries whose estimated Jaccard similarity to the text reaches T, as
        ``[(id, distance, similarity)]``; the estimate comes from a 512-byte
        sketch of each entry's verification features (standard error about
        0.02 at 0.8), as the service's. Entries added by fingerprint are kept
        by distance alone, with similarity None. Sketches are not saved in
        index files."""
        k = self.k if k is None else k
        if verify is None:
            return self._inner.query(self._fp(x), k)
        if not isinstance(x, str):
            raise TypeError("verify= compares texts: query with a str")
        if not 0.0 < verify <= 1.0:
            raise NeardupError(f"verify={verify} is out of range: use a similarity in (0, 1], e.g. 0.8")
        return self._inner.query_verified(self._fp(x), x, k, float(verify))

    def query_batch(self, xs: Any, k: Optional[int] = None) -> List[List[Tuple[Id, int]]]:
        """:meth:`query` for many fingerprints (or texts), in parallel."""
        cfg = self.config
        if isinstance(xs, np.ndarray) and xs.ndim == 2 and cfg is not None and cfg.input == "vector":
            xs = fingerprint_vectors(xs, config=cfg)
        elif not isinstance(xs, np.ndarray) and len(xs) and isinstance(xs[0], str):
            cfg = self.config
            if cfg is None:
                raise NeardupError("this index has no configuration: query it with fingerprints")
            xs = fingerprints(xs, cfg)
        return self._inner.query_batch(_words(xs, self.bits), self.k if k is None else k)

    def add(self, id: Id, x: Union[int, str]) -> None:
        """Adds one entry (searchable at once); a text is also kept as its
        verification sketch, for ``query(..., verify=T)``."""
        self._inner.add(id, self._fp(x))
        if isinstance(x, str):
            self._inner.add_sketch(x)

    def delete(self, ids: Iterable[Id]) -> int:
        """Deletes every entry with one of ``ids``; returns how many."""
        return self._inner.delete(list(ids))

    def self_join(self, k: Optional[int] = None) -> List[Tuple[Id, Id, int]]:
        """Every pair of entries within ``k``: ``[(id_a, id_b, distance)]``."""
        return self._inner.self_join(self.k if k is None else k)


@dataclass
class DedupResult:
    """The outcome of :func:`dedup`.

    ``pairs``: ``(id_a, id_b, distance, similarity)`` for every near-duplicate
    pair (the Jaccard or cosine similarity; None without verification);
    ``clusters``: ``(representative, members)`` for every cluster of two or
    more; ``keep``: for each input, whether it survives; ``representatives``:
    each input's representative id (None for a row left out by
    ``skip_invalid``).

    The annotation of each input (``neardup dedup --annotate``):
    ``cluster``, its cluster's representative id (its own id when it has no
    near-duplicate); ``duplicate_of``, the representative it is a copy of
    (None when kept); ``similarity``, the highest similarity of its pairs
    (verified, else estimated from the distance as cos(pi d / bits); None
    without pairs).
    """

    pairs: List[Tuple[Id, Id, int, Optional[float]]]
    clusters: List[Tuple[Id, List[Id]]]
    keep: np.ndarray
    representatives: List[Optional[Id]] = field(repr=False)
    k: int = 0
    verified: bool = False
    cluster: List[Optional[Id]] = field(default_factory=list, repr=False)
    duplicate_of: List[Optional[Id]] = field(default_factory=list, repr=False)
    similarity: List[Optional[float]] = field(default_factory=list, repr=False)

    def annotations(self) -> List[dict]:
        """``{"cluster", "duplicate_of", "similarity"}`` for each input, as
        ``neardup dedup --annotate`` adds them to the records."""
        return [
            {"cluster": c, "duplicate_of": d, "similarity": s}
            for c, d, s in zip(self.cluster, self.duplicate_of, self.similarity)
        ]

    def filter(self, data: Any) -> Any:
        """The rows of ``data`` (what was deduplicated: a list, a numpy or
        pyarrow array, a pandas Series or DataFrame, a HuggingFace Dataset)
        that survive, in order."""
        return _take(data, self.keep)

    def annotate(self, data: Any) -> Any:
        """``data`` (a pandas DataFrame or a HuggingFace Dataset) with the
        columns ``cluster``, ``duplicate_of`` and ``similarity`` added; a list
        of dicts for anything else."""
        kind = _kind(data)
        if kind == "pandas-frame":
            return data.assign(cluster=self.cluster, duplicate_of=self.duplicate_of, similarity=self.similarity)
        if kind == "dataset":
            out = data
            for name in ("cluster", "duplicate_of", "similarity"):
                out = out.add_column(name, getattr(self, name))
            return out
        return self.annotations()


def _kind(x: Any) -> str:
    """What a collection of documents is, by its type's module."""
    mod = type(x).__module__
    name = type(x).__name__
    if mod.startswith("pandas"):
        return "pandas-frame" if name == "DataFrame" else "pandas-series"
    if mod.startswith("datasets"):
        return "dataset"
    if mod.startswith("pyarrow"):
        return "arrow-table" if name in ("Table", "RecordBatch") else "arrow"
    if isinstance(x, np.ndarray):
        return "numpy"
    return "sequence"


def _take(data: Any, keep: np.ndarray) -> Any:
    kind = _kind(data)
    if kind in ("pandas-frame", "pandas-series"):
        return data[keep]
    if kind == "dataset":
        return data.select(np.flatnonzero(keep).tolist())
    if kind in ("arrow", "arrow-table"):
        import pyarrow as pa

        return data.filter(pa.array(keep))
    if kind == "numpy":
        return data[keep]
    return [x for x, k in zip(data, keep) if k]


def _column(data: Any, name: Optional[str], what: str) -> Optional[list]:
    """Column ``name`` of a DataFrame, Dataset or Arrow table as a list."""
    kind = _kind(data)
    if kind not in ("pandas-frame", "dataset", "arrow-table"):
        return None
    columns = list(data.column_names) if kind != "pandas-frame" else [str(c) for c in data.columns]
    if name is None:
        raise TypeError(f"give {what}= to say which column holds the texts (columns: {columns})")
    if name not in columns:
        raise InputError(f"there is no column {name!r} (columns: {columns}): pass {what}= another")
    if kind == "pandas-frame":
        return data[name].tolist()
    if kind == "dataset":
        return list(data[name])
    return data.column(name).to_pylist()


def _null(x: Any) -> bool:
    return x is None or (isinstance(x, float) and x != x)


def _read_texts(data: Any, text_col: Optional[str], what: str = "text_col") -> list:
    """The texts of ``data``: a list or iterable of str, a numpy array, a
    pyarrow string array, a pandas Series, or column ``text_col`` of a
    pandas DataFrame, a HuggingFace Dataset or an Arrow table. Nulls (None,
    NaN) stay None here, and are refused or skipped by the caller."""
    col = _column(data, text_col if text_col is not None else ("text" if _kind(data) == "dataset" else None), what)
    if col is not None:
        return col
    kind = _kind(data)
    if kind == "arrow":
        import pyarrow as pa

        chunks = data.chunks if isinstance(data, pa.ChunkedArray) else [data]
        return [t for c in chunks for t in c.to_pylist()]
    if kind in ("pandas-series", "numpy"):
        return data.tolist()
    if isinstance(data, (str, bytes)):
        raise TypeError("texts must be a sequence of str, not one str")
    return list(data)


def _valid_texts(texts: list, skip_invalid: bool, first_row: int = 0) -> Tuple[list, Optional[list]]:
    """The texts that are str, and their rows if some were skipped. A null or
    a non-str is an error naming its row, as the command line refuses a null
    text, unless ``skip_invalid`` leaves it out (as ``--skip-invalid``)."""
    rows = []
    for i, t in enumerate(texts):
        if isinstance(t, str):
            continue
        if not skip_invalid:
            what = "null" if _null(t) else f"a {type(t).__name__}, not a str"
            raise InputError(
                f"row {first_row + i}: the text is {what}; drop or fill such rows, "
                "or pass skip_invalid=True to leave them out"
            )
        rows.append(i)
    if not rows:
        return texts, None
    skipped = set(rows)
    kept_rows = [i for i in range(len(texts)) if i not in skipped]
    return [texts[i] for i in kept_rows], kept_rows


def _verify_threshold(verify: Union[bool, str, None, float]) -> Optional[float]:
    if verify is None or verify is False:
        return None
    if verify is True:
        return 0.8
    if isinstance(verify, (int, float)):
        # A bare threshold is Jaccard's, as the command line's --verify 0.8.
        return _rs.verify_threshold(repr(float(verify)))
    if isinstance(verify, str):
        return _rs.verify_threshold(verify)
    raise NeardupError(f"verify={verify!r}: use 'jaccard:T' with T in [0, 1], e.g. 'jaccard:0.8', or False")


def dedup(
    texts: Any = None,
    *,
    fingerprints: Any = None,
    ids: Optional[Sequence[Id]] = None,
    k: Optional[int] = None,
    verify: Union[bool, str, float, None] = True,
    policy: str = "components",
    config: Optional[FingerprintConfig] = None,
    vectors: Any = None,
    weighted: Any = None,
    min_similarity: Optional[float] = None,
    centre: bool = True,
    keep_by: str = "first",
    against: Any = None,
    against_ids: Optional[Sequence[Id]] = None,
    text_col: Optional[str] = None,
    id_col: Optional[str] = None,
    skip_invalid: bool = False,
    annotate: bool = False,
    **kwargs: Any,
) -> Any:
    """Near-duplicate pairs and clusters of a corpus, as ``neardup dedup`` finds
    them (same defaults, same answers).

    Give ``texts`` (verified by exact Jaccard similarity of word 3-shingles,
    ``verify="jaccard:0.8"`` (or ``0.8``) by default; candidates from 128-bit
    fingerprints of single tokens centred on the corpus, within k = 19,
    unless ``config`` or pipeline keywords say otherwise; ``centre=False``
    for plain fingerprints within k = 15, as ``--no-centre``) or ready
    ``fingerprints`` (no verification; k = 3 for 64 bits), ``vectors=`` or
    ``weighted=`` (weighted features, dicts of feature -> weight, as the
    command line's ``--features-field``).

    ``texts``: a list (or iterable) of str, a numpy or pyarrow array, a
    pandas Series, or a pandas DataFrame, HuggingFace ``datasets.Dataset`` or
    Arrow table with the texts in column ``text_col`` (a Dataset's default
    ``"text"``) and the ids in ``id_col`` (default: positions). A null text is
    an error naming its row, as on the command line; ``skip_invalid=True``
    leaves such rows out (never kept).

    ``keep_by``: which document of a cluster survives: ``first``,
    ``longest`` or ``field:NAME[:asc|desc]`` (a column of the DataFrame or
    Dataset). ``against``: documents already clean (the same kinds as
    ``texts``, ids ``against_ids``): pairs with them are reported, they are
    preferred to every new document and never dropped; the result describes
    the new documents. Pipeline keywords (``bits``, ``tokenizer``,
    ``features``, ``weights``, ``idf`` ...) and ``config`` combine as the
    command line's flags and ``--config`` do. ``annotate=True`` returns the
    DataFrame or Dataset with ``cluster``, ``duplicate_of`` and
    ``similarity`` columns (see :class:`DedupResult`); otherwise a
    :class:`DedupResult` (``result.filter(data)`` gives the rows kept).

    >>> r = neardup.dedup(["the cat sat on the mat " * 5, "the cat sat on the mat " * 5 + "!", "dogs bark loudly at night " * 5], ids=["a", "b", "c"])
    >>> [(a, b) for a, b, *_ in r.pairs], r.clusters
    ([('a', 'b')], [('a', ['a', 'b'])])
    """
    given = [x is not None for x in (texts, fingerprints, vectors, weighted)]
    if sum(given) != 1:
        raise TypeError("give one of texts, fingerprints=, vectors= and weighted=")
    if against is not None and (vectors is not None or weighted is not None):
        raise ConfigError("against= takes texts; deduplicate vectors or weighted features without it (as neardup dedup)")
    if vectors is not None:
        result = _dedup_vectors(vectors, ids, k, verify, policy, min_similarity, kwargs)
        return result.annotate(vectors) if annotate else result
    if weighted is not None:
        result = _dedup_features(weighted, ids, k, verify, policy, min_similarity, kwargs)
        return result.annotate(weighted) if annotate else result
    threshold = _verify_threshold(verify) if texts is not None else None
    if min_similarity is not None and not -1.0 <= float(min_similarity) <= 1.0:
        raise ConfigError(f"min_similarity={min_similarity} is out of range: use a similarity in [-1, 1], e.g. 0.9")
    data = texts
    rows = None
    preference = None
    first = 0
    old_ids: list = []
    sets = None
    centred = False
    if texts is not None:
        texts, rows = _valid_texts(_read_texts(texts, text_col), skip_invalid)
        if ids is None and id_col is not None:
            ids = _column(data, id_col, "id_col")
        if rows is not None:
            # Ids stay those of the input's rows (positions by default).
            ids = [list(ids)[i] for i in rows] if ids is not None else rows
        old: list = []
        if against is not None:
            old, _ = _valid_texts(_read_texts(against, text_col), False)
            if against_ids is None and id_col is not None and _kind(against) in ("pandas-frame", "dataset", "arrow-table"):
                against_ids = _column(against, id_col, "id_col")
            old_ids = list(against_ids) if against_ids is not None else [f"against:{i}" for i in range(len(old))]
            if len(old_ids) != len(old):
                raise InputError(f"{len(old_ids)} against_ids for {len(old)} documents")
            first = len(old)
        all_texts = old + texts
        cfg, candidates = _dedup_config(threshold is not None, config, kwargs)
        bits = cfg.bits
        centred = threshold is not None and candidates and centre
        if centred:
            shares = _rs.bit_shares(cfg, all_texts)
            words = _rs.centred_words(shares, _rs.centre_of(shares, bits))
        else:
            words = _words(_fingerprints(all_texts, cfg), bits)
        if threshold is not None:
            sets = _rs.shingle_sets(cfg, all_texts)
        n = len(texts)
        records = None
        if keep_by.startswith("field:"):
            import json as _json

            name = keep_by.split(":")[1]
            values = _column(data, name, "keep_by") if _kind(data) in ("pandas-frame", "dataset", "arrow-table") else None
            if values is None:
                raise ConfigError(f"keep_by={keep_by!r} reads a field: deduplicate a DataFrame or Dataset with a column {name!r}")
            if rows is not None:
                values = [values[i] for i in rows]
            records = [_json.dumps({name: None if _null(v) else v}, default=str) for v in values]
        mine = _rs.keep_by_preference(keep_by, texts if keep_by == "longest" else None, records)
        if first or mine is not None:
            preference = list(range(first)) + [first + p for p in (mine if mine is not None else range(n))]
    else:
        if keep_by != "first":
            raise ConfigError(f"keep_by={keep_by!r} reads the documents, and fingerprints= has none: give the texts")
        if against is not None:
            raise ConfigError("against= needs the documents' texts, and fingerprints= has none: give the texts")
        arr = fingerprints
        bits = 128 if (isinstance(arr, np.ndarray) and arr.ndim == 2) or (config is not None and config.bits == 128) else 64
        words = _words(arr, bits)
        n = len(words) // (bits // 8)
    k_given = k is not None
    if k is None:
        k = _rs.centred_k(bits) if centred else _rs.default_k(bits, threshold is not None)
    if min_similarity is not None:
        # As --min-similarity: the largest distance whose estimate qualifies.
        import math

        most = int(math.floor(bits * math.acos(float(min_similarity)) / math.pi + 1e-9))
        k = min(k, most) if k_given else min(most, (bits * 3 // 16) if centred else bits // 8)
    ids = list(ids) if ids is not None else list(range(n))
    if len(ids) != n:
        raise InputError(f"{len(ids)} ids for {n} documents")
    pairs, reps = _rs.dedup_positions(words, bits, k, policy, threshold, sets, preference)
    return _result(old_ids + ids, pairs, reps, k, threshold is not None, bits, first, rows, len(_read_texts(data, text_col)) if rows is not None else None, data if annotate else None)


def _result(ids: list, pairs: list, reps: list, k: int, verified: bool, bits: int, first: int = 0,
            rows: Optional[list] = None, total: Optional[int] = None, annotate: Any = None) -> Any:
    """A :class:`DedupResult` over the new documents (after ``first`` old
    ones), spread back over ``total`` input rows when ``rows`` were kept of
    them; annotated ``annotate`` if given."""
    import math

    best: dict = {}
    for a, b, d, j in pairs:
        score = j if j >= 0 else math.cos(math.pi * d / bits)
        for x in (a, b):
            if x not in best or score > best[x]:
                best[x] = score
    n = len(reps)
    out_pairs = [(ids[a], ids[b], d, (None if j < 0 else j)) for a, b, d, j in pairs if b >= first]
    clusters = [(ids[r], [ids[m] for m in members]) for r, members in _rs.clusters_of(reps) if members[-1] >= first]
    new = range(first, n)
    keep = [reps[i] == i for i in new]
    representative = [ids[reps[i]] for i in new]
    duplicate_of = [None if reps[i] == i else ids[reps[i]] for i in new]
    similarity = [best.get(i) for i in new]
    if rows is not None:
        spread = lambda values, fill: [fill] * total if not rows else _spread(values, rows, total, fill)
        keep = spread(keep, False)
        representative = spread(representative, None)
        duplicate_of = spread(duplicate_of, None)
        similarity = spread(similarity, None)
    result = DedupResult(
        pairs=out_pairs,
        clusters=clusters,
        keep=np.array(keep, dtype=bool),
        representatives=representative,
        k=k,
        verified=verified,
        cluster=representative,
        duplicate_of=duplicate_of,
        similarity=similarity,
    )
    return result.annotate(annotate) if annotate is not None else result


def _spread(values: list, rows: list, total: int, fill: Any) -> list:
    out = [fill] * total
    for v, r in zip(values, rows):
        out[r] = v
    return out


#: Cosine similarity that dense vectors must reach by default (as the CLI).
DEFAULT_COSINE = 0.95


def _dedup_vectors(
    vectors: Any, ids: Optional[Sequence[Id]], k: Optional[int], verify: Any, policy: str,
    min_similarity: Optional[float], kwargs: dict,
) -> DedupResult:
    """Dedup of dense vectors as ``neardup dedup`` does it: 128-bit
    fingerprints (``bits=``), candidates within the k that finds pairs at the
    threshold 99% of the time, confirmed by exact cosine similarity."""
    unknown = set(kwargs) - {"bits", "seed"}
    if unknown:
        raise TypeError(f"vectors take bits= and seed=, not {sorted(unknown)}")
    if isinstance(verify, str):
        raise NeardupError("vectors are confirmed by exact cosine similarity: set min_similarity=, not verify='jaccard:T'")
    cos = DEFAULT_COSINE if min_similarity is None else float(min_similarity)
    if not -1.0 <= cos <= 1.0:
        raise NeardupError(f"min_similarity={cos}: use a similarity in [-1, 1]")
    bits = int(kwargs.get("bits", 128))
    blocks = list(_vector_rows(vectors))
    dim = blocks[0][0].shape[1] if blocks else 1
    cfg = vector_config(bits, dim, int(kwargs.get("seed", 0)))
    fps = fingerprint_vectors(vectors, config=cfg)
    data = _words(fps, bits)
    n = len(data) // (bits // 8)
    checked = verify is not False and verify is not None
    if k is None:
        k = _rs.default_vector_k(bits, cos, checked)
    ids = list(ids) if ids is not None else list(range(n))
    if len(ids) != n:
        raise NeardupError(f"{len(ids)} ids for {n} vectors")
    if checked:
        rows = b"".join(b.astype(np.float32).tobytes() for b, _ in blocks)
        pairs, reps = _rs.dedup_vectors(data, bits, k, policy, cos, rows, dim)
    else:
        pairs, reps = _rs.dedup_positions(data, bits, k, policy, None, None)
    return _result(ids, pairs, reps, k, checked, bits)


def _dedup_features(
    features: Any, ids: Optional[Sequence[Id]], k: Optional[int], verify: Any, policy: str,
    min_similarity: Optional[float], kwargs: dict,
) -> DedupResult:
    """Dedup of weighted features (dicts of feature -> weight, or lists of
    pairs) as ``neardup dedup`` does it: 128-bit fingerprints (``bits=``,
    ``hash=``, ``seed=``), pairs within the largest k whose estimated cosine
    similarity reaches ``min_similarity`` (default 0.95), not verified."""
    import math

    unknown = set(kwargs) - {"bits", "seed", "hash"}
    if unknown:
        raise TypeError(f"weighted features take bits=, seed= and hash=, not {sorted(unknown)}")
    if isinstance(verify, str) or (verify is not True and verify not in (None, False)):
        raise ConfigError("verify compares texts; weighted features are paired by estimated cosine similarity: set min_similarity=")
    cos = DEFAULT_COSINE if min_similarity is None else float(min_similarity)
    if not -1.0 <= cos <= 1.0:
        raise ConfigError(f"min_similarity={cos}: use a similarity in [-1, 1]")
    bits = int(kwargs.get("bits", 128))
    cfg = _rs.features_config(bits, kwargs.get("hash", "xxh3"), int(kwargs.get("seed", 0)))
    if _kind(features) in ("pandas-series", "numpy", "arrow"):
        features = _read_texts(features, None)
    fps = []
    for row, f in enumerate(features):
        if _null(f):
            raise InputError(f"row {row}: the features are null; drop or fill such rows")
        items = list(f.items()) if isinstance(f, dict) else list(f)
        try:
            fps.append(_rs.fingerprint_input(cfg, [(str(a), float(w)) for a, w in items]))
        except NeardupError as e:
            raise InputError(f"row {row}: {e}") from None
    data = _words(fps, bits)
    n = len(fps)
    max_k = bits // 8
    if k is None:
        k = min(max_k, int(math.floor(bits * math.acos(cos) / math.pi + 1e-9)))
    ids = list(ids) if ids is not None else list(range(n))
    if len(ids) != n:
        raise InputError(f"{len(ids)} ids for {n} documents")
    pairs, reps = _rs.dedup_positions(data, bits, k, policy, None, None)
    return _result(ids, pairs, reps, k, False, bits)


def _dedup_config(verified: bool, config: Optional[FingerprintConfig], kwargs: dict) -> Tuple[FingerprintConfig, bool]:
    """The configuration a dedup fingerprints with, and whether it is the
    candidate configuration (centred on the corpus), as ``neardup dedup``
    picks them: the Rust core's one rule, over ``config`` (or, with
    verification and no profile, the candidate configuration) with every
    keyword given applied, also one equal to a default. ``idf``: the IDF
    table's file. A keyword set to None is not given."""
    import json

    if config is not None and not isinstance(config, FingerprintConfig):
        raise TypeError("config must be a neardup.FingerprintConfig")
    given = {key: value for key, value in kwargs.items() if value is not None}
    idf = given.pop("idf", None)
    return _rs.dedup_config(verified, config, json.dumps(given), os.fspath(idf) if idf is not None else None)
