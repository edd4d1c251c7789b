"""Type stubs of the Rust extension (the public API is in neardup/__init__.py)."""

from typing import List, Optional, Sequence, Tuple, Union

Id = Union[int, str]

class NeardupError(ValueError): ...

class FingerprintConfig:
    """A fingerprint pipeline configuration (the Rust FingerprintConfig).

    >>> FingerprintConfig(bits=128, features="shingles:3", weights="tf")
    >>> FingerprintConfig(profile="python-simhash")  # PyPI simhash's fingerprints, bit for bit
    """

    def __init__(
        self,
        *,
        profile: Optional[str] = ...,
        bits: Optional[int] = ...,
        tokenizer: Optional[str] = ...,
        features: Optional[str] = ...,
        weights: Optional[str] = ...,
        top: Optional[int] = ...,
        hash: Optional[str] = ...,
        seed: Optional[int] = ...,
        stopwords: Optional[bool] = ...,
        html: Optional[bool] = ...,
        nfkc: Optional[bool] = ...,
        casefold: Optional[bool] = ...,
        whitespace: Optional[bool] = ...,
    ) -> None: ...
    def to_json(self) -> str: ...
    @staticmethod
    def from_json(text: str) -> FingerprintConfig: ...
    def digest(self) -> str: ...
    @property
    def bits(self) -> int: ...
    @property
    def profile(self) -> str: ...
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

class _Index:
    @staticmethod
    def build(
        data: bytes,
        bits: int,
        k: int,
        ids: Optional[List[Id]] = ...,
        config: Optional[FingerprintConfig] = ...,
        design: Optional[str] = ...,
    ) -> _Index: ...
    @staticmethod
    def load(path: str) -> _Index: ...
    def save(self, path: str) -> None: ...
    @property
    def bits(self) -> int: ...
    @property
    def k(self) -> int: ...
    @property
    def config(self) -> Optional[FingerprintConfig]: ...
    def __len__(self) -> int: ...
    def query(self, fp: int, k: int) -> List[Tuple[Id, int]]: ...
    def query_batch(self, data: bytes, k: int) -> List[List[Tuple[Id, int]]]: ...
    def add(self, id: Id, fp: int) -> None: ...
    def delete(self, ids: List[Id]) -> int: ...
    def self_join(self, k: int) -> List[Tuple[Id, Id, int]]: ...

def fingerprint(config: FingerprintConfig, text: str) -> int: ...
def fingerprints_list(config: FingerprintConfig, texts: Sequence[str], threads: Optional[int] = ...) -> bytes: ...
def fingerprints_arrow(
    config: FingerprintConfig,
    offsets: bytes,
    data: bytes,
    offset: int,
    length: int,
    large: bool,
    validity: Optional[bytes] = ...,
    threads: Optional[int] = ...,
) -> bytes: ...
def shingle_sets(config: FingerprintConfig, texts: Sequence[str]) -> List[bytes]: ...
def jaccard_pairs(a: List[bytes], b: List[bytes]) -> List[float]: ...
def dedup_positions(
    data: bytes,
    bits: int,
    k: int,
    policy: str,
    threshold: Optional[float] = ...,
    sets: Optional[List[bytes]] = ...,
) -> Tuple[List[Tuple[int, int, int, float]], List[int]]: ...
def clusters_of(reps: List[int]) -> List[Tuple[int, List[int]]]: ...
def candidate_config() -> FingerprintConfig: ...
def default_k(bits: int, verify: bool) -> int: ...
def join_design(bits: int, k: int, n: float) -> str: ...
def table_keys(design: str, data: bytes, bits: int) -> bytes: ...
def sorted_group_pairs(
    design: str,
    bits: int,
    k: int,
    table: bytes,
    key_hi: bytes,
    key_lo: bytes,
    block_i: bytes,
    block_j: bytes,
    block: bytes,
    pos: bytes,
    fp_hi: bytes,
    fp_lo: bytes,
) -> bytes: ...
