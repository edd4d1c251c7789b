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
from ._neardup import FingerprintConfig, NeardupError

__all__ = [
    "FingerprintConfig",
    "NeardupError",
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
]

__version__ = "0.1.0"

Id = Union[int, str]


@functools.lru_cache(maxsize=64)
def _cached_config(items: Tuple[Tuple[str, Any], ...]) -> FingerprintConfig:
    return FingerprintConfig(**dict(items))


def _config(config: Optional[FingerprintConfig], kwargs: dict) -> FingerprintConfig:
    if config is not None:
        if kwargs:
            raise TypeError("give either config= or pipeline keywords, not both")
        if not isinstance(config, FingerprintConfig):
            raise TypeError("config must be a neardup.FingerprintConfig")
        return config
    return _cached_config(tuple(sorted(kwargs.items())))


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
        ``seed``; the index then answers queries by vector."""
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
        built = cls(_rs._Index.build(data, bits, k, list(ids) if ids is not None else None, config))
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

    ``pairs``: ``(id_a, id_b, distance, jaccard)`` for every near-duplicate pair
    (``jaccard`` is None without verification); ``clusters``: ``(representative,
    members)`` for every cluster of two or more; ``keep``: for each input, whether
    it survives; ``representatives``: each input's representative id.
    """

    pairs: List[Tuple[Id, Id, int, Optional[float]]]
    clusters: List[Tuple[Id, List[Id]]]
    keep: np.ndarray
    representatives: List[Id] = field(repr=False)
    k: int = 0
    verified: bool = False


def _verify_threshold(verify: Union[bool, str, None, float]) -> Optional[float]:
    if verify is None or verify is False:
        return None
    if verify is True:
        return 0.8
    if isinstance(verify, (int, float)):
        return float(verify)
    if isinstance(verify, str):
        return _rs.verify_threshold(verify)
    raise NeardupError(f"verify={verify!r}: use 'jaccard:T' with T in [0, 1], e.g. 'jaccard:0.8', or False")


def dedup(
    texts: Optional[Sequence[str]] = None,
    *,
    fingerprints: Any = None,
    ids: Optional[Sequence[Id]] = None,
    k: Optional[int] = None,
    verify: Union[bool, str, None] = True,
    policy: str = "components",
    config: Optional[FingerprintConfig] = None,
    vectors: Any = None,
    min_similarity: Optional[float] = None,
    centre: bool = True,
    **kwargs: Any,
) -> DedupResult:
    """Near-duplicate pairs and clusters of a corpus, as ``neardup dedup`` finds
    them (same defaults, same answers).

    Give ``texts`` (verified by exact Jaccard similarity of word 3-shingles,
    ``verify="jaccard:0.8"`` by default; candidates from 128-bit fingerprints
    of single tokens centred on the corpus, within k = 19, unless ``config``
    or pipeline keywords say otherwise; ``centre=False`` for plain
    fingerprints within k = 15, as ``--no-centre``) or ready ``fingerprints``
    (no verification; k = 3 for 64 bits).

    >>> r = neardup.dedup(["the cat sat on the mat " * 5, "the cat sat on the mat " * 5 + "!", "dogs bark loudly at night " * 5], ids=["a", "b", "c"])
    >>> [(a, b) for a, b, *_ in r.pairs], r.clusters
    ([('a', 'b')], [('a', ['a', 'b'])])
    """
    if vectors is not None:
        if texts is not None or fingerprints is not None:
            raise TypeError("give texts, fingerprints= or vectors=, one of them")
        return _dedup_vectors(vectors, ids, k, verify, policy, min_similarity, kwargs)
    threshold = _verify_threshold(verify) if texts is not None else None
    if texts is None and fingerprints is None:
        raise TypeError("give texts or fingerprints=")
    if texts is not None and fingerprints is not None:
        raise TypeError("give texts or fingerprints=, not both")
    sets = None
    centred = False
    if texts is not None:
        texts = list(texts)
        cfg = _dedup_config(threshold is not None, config, kwargs)
        bits = cfg.bits
        centred = threshold is not None and config is None and centre
        if centred:
            shares = _rs.bit_shares(cfg, texts)
            data = _rs.centred_words(shares, _rs.centre_of(shares, bits))
        else:
            data = _words(_fingerprints(texts, cfg), bits)
        if threshold is not None:
            sets = _rs.shingle_sets(cfg, texts)
        n = len(texts)
    else:
        arr = fingerprints
        bits = 128 if (isinstance(arr, np.ndarray) and arr.ndim == 2) or (config is not None and config.bits == 128) else 64
        data = _words(arr, bits)
        n = len(data) // (bits // 8)
    if k is None:
        k = _rs.centred_k(bits) if centred else _rs.default_k(bits, threshold is not None)
    ids = list(ids) if ids is not None else list(range(n))
    if len(ids) != n:
        raise NeardupError(f"{len(ids)} ids for {n} documents")
    pairs, reps = _rs.dedup_positions(data, bits, k, policy, threshold, sets)
    return DedupResult(
        pairs=[(ids[a], ids[b], d, (None if j < 0 else j)) for a, b, d, j in pairs],
        clusters=[(ids[r], [ids[m] for m in members]) for r, members in _rs.clusters_of(reps)],
        keep=np.array([r == i for i, r in enumerate(reps)], dtype=bool),
        representatives=[ids[r] for r in reps],
        k=k,
        verified=threshold is not None,
    )


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
    return DedupResult(
        pairs=[(ids[a], ids[b], d, (None if c < 0 else c)) for a, b, d, c in pairs],
        clusters=[(ids[r], [ids[m] for m in members]) for r, members in _rs.clusters_of(reps)],
        keep=np.array([r == i for i, r in enumerate(reps)], dtype=bool),
        representatives=[ids[r] for r in reps],
        k=k,
        verified=checked,
    )


def _dedup_config(verified: bool, config: Optional[FingerprintConfig], kwargs: dict) -> FingerprintConfig:
    """The configuration a dedup fingerprints with, as ``neardup dedup`` picks it:
    with verification and no ``config``, the candidate configuration adjusted
    by the keywords; otherwise ``config`` or the keywords."""
    if verified and config is None:
        base = _rs.candidate_config()
        return FingerprintConfig.from_json(_merge_json(base.to_json(), kwargs)) if kwargs else base
    return _config(config, kwargs)


def _merge_json(base_json: str, kwargs: dict) -> str:
    """Pipeline keywords applied on top of a configuration (as JSON)."""
    import json

    base = json.loads(base_json)
    override = json.loads(FingerprintConfig(**kwargs).to_json())
    default = json.loads(FingerprintConfig().to_json())
    for key, value in override.items():
        if value != default.get(key):
            base[key] = value
    return json.dumps(base)
