"""Dense vectors and weighted features from Python, against the CLI, the
binomial model and brute-force cosine."""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import neardup


def neardup_bin():
    p = os.environ.get("NEARDUP_BIN")
    if not p or not Path(p).exists():
        pytest.fail("the neardup binary is not built: run cargo build first, or set NEARDUP_BIN")
    return p


def cli(*args):
    r = subprocess.run([neardup_bin(), *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def planted(n=600, d=48, dups=60, noise=0.08, seed=3):
    """Random vectors, the last `dups` noisy copies of the first ones."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float32)
    x[n - dups:] = x[:dups] + noise * rng.standard_normal((dups, d)).astype(np.float32)
    return x


def test_fingerprints_equal_the_cli_for_npy_jsonl_and_arrow(tmp_path):
    import pyarrow as pa

    x = planted()
    np.save(tmp_path / "v.npy", x)
    with open(tmp_path / "v.jsonl", "w") as f:
        for i, row in enumerate(x):
            f.write(json.dumps({"id": i, "vector": [float(v) for v in row]}) + "\n")
    for bits in (64, 128):
        want = [int(json.loads(l)["simhash"], 16) for l in cli("fingerprint", str(tmp_path / "v.npy"), "--bits", str(bits), "--seed", "9").splitlines()]
        jsonl = [int(json.loads(l)["simhash"], 16) for l in cli("fingerprint", str(tmp_path / "v.jsonl"), "--vector-field", "--bits", str(bits), "--seed", "9").splitlines()]
        assert jsonl == want
        got = neardup.fingerprint_vectors(x, bits=bits, seed=9)
        if bits == 128:
            got = [(int(h) << 64) | int(l) for h, l in got]
        assert [int(g) for g in got] == want
        arrow = neardup.fingerprint_vectors(pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), x.shape[1]), bits=bits, seed=9)
        assert np.array_equal(arrow, neardup.fingerprint_vectors(x, bits=bits, seed=9))
    # float64 rounds to float32 first, everywhere.
    assert np.array_equal(neardup.fingerprint_vectors(x.astype(np.float64)), neardup.fingerprint_vectors(x))


def test_distances_follow_the_angle():
    """Over many random pairs at a fixed angle, the mean distance is within
    three standard errors of bits * angle / pi (each bit differs with
    probability angle / pi, independently)."""
    rng = np.random.default_rng(1)
    pairs, d = 400, 96
    for degrees in (10, 45, 90):
        theta = np.radians(degrees)
        a = rng.standard_normal((pairs, d))
        r = rng.standard_normal((pairs, d))
        r -= (r * a).sum(1, keepdims=True) / (a * a).sum(1, keepdims=True) * a
        a /= np.linalg.norm(a, axis=1, keepdims=True)
        r /= np.linalg.norm(r, axis=1, keepdims=True)
        b = np.cos(theta) * a + np.sin(theta) * r
        for bits in (64, 128):
            fa, fb = neardup.fingerprint_vectors(a, bits=bits), neardup.fingerprint_vectors(b, bits=bits)
            x = np.bitwise_xor(fa, fb).reshape(pairs, -1)
            dist = np.array([sum(bin(int(w)).count("1") for w in row) for row in x])
            p = theta / np.pi
            se = np.sqrt(bits * p * (1 - p) / pairs)
            assert abs(dist.mean() - bits * p) < 3 * se + 1e-9, (degrees, bits, dist.mean(), bits * p)


def test_dedup_equals_the_cli_and_brute_force(tmp_path):
    x = planted()
    ids = [f"v{i}" for i in range(len(x))]
    np.save(tmp_path / "v.npy", x)
    (tmp_path / "ids.txt").write_text("".join(i + "\n" for i in ids))
    cli("dedup", str(tmp_path / "v.npy"), "--ids", str(tmp_path / "ids.txt"), "--min-similarity", "0.97", "--pairs", str(tmp_path / "p.jsonl"), "-q")
    want = sorted((p["a"], p["b"], p["distance"]) for p in map(json.loads, (tmp_path / "p.jsonl").read_text().splitlines()))
    r = neardup.dedup(vectors=x, ids=ids, min_similarity=0.97)
    assert sorted((a, b, d) for a, b, d, _ in r.pairs) == want
    # Every reported pair is at or above the threshold, and no pair above it
    # is missed here (the copies are far above it, found with certainty).
    n = np.linalg.norm(x, axis=1)
    cos = (x @ x.T) / np.outer(n, n)
    truth = {(ids[i], ids[j]) for i in range(len(x)) for j in range(i + 1, len(x)) if cos[i, j] >= 0.97}
    assert {(a, b) for a, b, *_ in r.pairs} == truth
    assert all(c >= 0.97 for *_, c in r.pairs)
    assert len(truth) == 60


def test_index_of_vectors_answers_vector_queries_and_opens_in_the_cli(tmp_path):
    x = planted()
    idx = neardup.Index.build(vectors=x, ids=[f"v{i}" for i in range(len(x))], k=4)
    assert idx.config.input == "vector" and idx.config.dim == x.shape[1]
    assert idx.query(x[3])[0] == ("v3", 0)
    path = tmp_path / "v.ndx"
    idx.save(path)
    out = json.loads(cli("query", str(path), "--vector", json.dumps([float(v) for v in x[3]])))
    assert out["matches"][0] == {"id": "v3", "distance": 0}
    with pytest.raises(neardup.NeardupError, match="dimensions"):
        idx.query(x[3][:-1])


def test_features_and_bad_vectors():
    assert neardup.fingerprint_features({"a": 1.0, "b": 2.5}) == neardup.fingerprint_features([("b", 2.5), ("a", 1.0)])
    assert neardup.fingerprint_features({"a": 1.0}) != neardup.fingerprint_features({"a": 1.0}, seed=1)
    with pytest.raises(neardup.NeardupError, match="row 1: .*NaN"):
        neardup.fingerprint_vectors(np.array([[1.0, 2.0], [1.0, np.nan]]))
    with pytest.raises(neardup.NeardupError, match="row 0: .*all zeros"):
        neardup.fingerprint_vectors(np.zeros((1, 3)))
    with pytest.raises(neardup.NeardupError, match="2-D"):
        neardup.fingerprint_vectors(np.ones(3))
    import pyarrow as pa

    ragged = pa.array([[1.0, 2.0], [1.0, 2.0, 3.0]])
    with pytest.raises(neardup.NeardupError, match="row 1: the vector has 3 dimensions"):
        neardup.fingerprint_vectors(ragged)
