"""The Python package against brute force, the CLI and PyPI simhash."""

import json
import os
import math
import random
import subprocess
from pathlib import Path

import numpy as np
import pytest

import neardup

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "sample.jsonl"


def neardup_bin():
    """The CLI binary (tests/conftest.py finds it; CI builds it first)."""
    p = os.environ.get("NEARDUP_BIN")
    if not p or not Path(p).exists():
        pytest.fail("the neardup binary is not built: run cargo build first, or set NEARDUP_BIN")
    return p


def cli(*args, input=None):
    r = subprocess.run([neardup_bin(), *args], capture_output=True, text=True, input=input)
    assert r.returncode == 0, r.stderr
    return r.stdout


def sample_docs():
    return [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]


def test_fingerprints_equal_the_cli():
    docs = sample_docs()
    for flags, kwargs in [([], {}), (["--bits", "128", "--features", "tokens"], {"bits": 128, "features": "tokens"})]:
        out = cli("fingerprint", str(SAMPLE), *flags)
        want = {json.loads(line)["id"]: json.loads(line)["simhash"] for line in out.splitlines()}
        bits = kwargs.get("bits", 64)
        for d in docs:
            assert neardup.to_hex(neardup.fingerprint(d["text"], **kwargs), bits) == want[d["id"]]
        arr = neardup.fingerprints([d["text"] for d in docs], **kwargs)
        got = [neardup.to_hex((int(x[0]) << 64 | int(x[1])) if bits == 128 else int(x), bits) for x in arr]
        assert got == [want[d["id"]] for d in docs]


def test_python_simhash_profile_is_a_drop_in():
    simhash = pytest.importorskip("simhash")
    rng = random.Random(3)
    words = ["alpha", "Beta", "γάμμα", "中文", "dé", "x1", "!!", "  ", "\n", "über", "ÅSTRÖM"]
    texts = ["", "a", "hello world"] + [" ".join(rng.choice(words) for _ in range(rng.randrange(1, 30))) for _ in range(200)]
    for t in texts:
        assert neardup.fingerprint(t, profile="python-simhash") == simhash.Simhash(t).value, t
    batch = neardup.fingerprints(texts, profile="python-simhash")
    assert [int(x) for x in batch] == [simhash.Simhash(t).value for t in texts]


def test_lists_arrow_and_threads_agree():
    pa = pytest.importorskip("pyarrow")
    texts = [f"document number {i} " * (i % 7 + 1) + "shared tail words here" for i in range(500)]
    base = neardup.fingerprints(texts)
    assert np.array_equal(base, neardup.fingerprints(texts, threads=1))
    assert np.array_equal(base, neardup.fingerprints(iter(texts)))
    assert np.array_equal(base, neardup.fingerprints(pa.array(texts)))
    assert np.array_equal(base, neardup.fingerprints(pa.array(texts, type=pa.large_string())))
    assert np.array_equal(base[100:300], neardup.fingerprints(pa.array(texts).slice(100, 200)))
    chunked = pa.chunked_array([texts[:250], texts[250:]])
    assert np.array_equal(base, neardup.fingerprints(chunked))
    with_nulls = pa.array([texts[0], None, texts[2]])
    assert list(neardup.fingerprints(with_nulls)) == [base[0], neardup.fingerprint(""), base[2]]
    arrow = neardup.fingerprints(texts, output="arrow")
    assert arrow.type == pa.uint64() and arrow.to_pylist() == [int(x) for x in base]
    wide = neardup.fingerprints(texts[:3], bits=128)
    assert wide.shape == (3, 2)
    assert [(int(h) << 64) | int(lo) for h, lo in wide] == [neardup.fingerprint(t, bits=128) for t in texts[:3]]


def test_config_round_trips_and_errors_carry_the_rust_message():
    c = neardup.FingerprintConfig(bits=128, features="shingles:2", weights="binary")
    assert neardup.FingerprintConfig.from_json(c.to_json()) == c
    assert c.bits == 128 and c != neardup.FingerprintConfig()
    assert neardup.fingerprint("x y z", config=c) == neardup.fingerprint("x y z", bits=128, features="shingles:2", weights="binary")
    with pytest.raises(neardup.NeardupError, match="features"):
        neardup.FingerprintConfig(features="shingles:99")
    with pytest.raises(neardup.NeardupError, match="64 or 128"):
        neardup.fingerprint("x", bits=32)
    with pytest.raises(neardup.NeardupError, match="python-simhash"):
        neardup.FingerprintConfig(profile="python-simhash", bits=128)
    with pytest.raises(TypeError):
        neardup.fingerprint(b"bytes")
    # Keywords given with a configuration override its settings, as flags
    # override --config.
    wide = neardup.FingerprintConfig(bits=128)
    assert neardup.fingerprint("x y z", config=wide, bits=64) == neardup.fingerprint("x y z", bits=64)
    assert isinstance(neardup.NeardupError("x"), ValueError)


def brute(fps, q, k):
    return sorted((d, i) for i, f in enumerate(fps) if (d := bin(f ^ q).count("1")) <= k)


@pytest.mark.parametrize("bits", [64, 128])
def test_index_against_brute_force(bits, tmp_path):
    rng = random.Random(bits)
    fps = [rng.getrandbits(bits) for _ in range(3000)]
    fps += [f ^ (1 << rng.randrange(bits)) ^ (1 << rng.randrange(bits)) for f in fps[:500]]
    ids = [f"d{i}" if i % 2 else i for i in range(len(fps))]
    idx = neardup.Index.build(fps, ids=ids, k=3, bits=bits)
    assert len(idx) == len(fps) and idx.k == 3
    queries = [fps[i] ^ (1 << rng.randrange(bits)) for i in range(0, 3500, 37)]
    for q in queries:
        assert sorted((d, ids.index(i)) for i, d in idx.query(q)) == brute(fps, q, 3)
    batch = idx.query_batch(queries, k=2)
    assert [sorted((d, ids.index(i)) for i, d in r) for r in batch] == [brute(fps, q, 2) for q in queries]
    pairs = {(a, b, d) for a, b, d in idx.self_join()}
    want = set()
    for i in range(len(fps)):
        for j in range(i + 1, len(fps)):
            d = bin(fps[i] ^ fps[j]).count("1")
            if d <= 3:
                want.add((ids[i], ids[j], d))
    assert {(a, b, d) if (a, b, d) in want else (b, a, d) for a, b, d in pairs} == want
    # add, delete, save, load.
    idx.add("new", fps[0] ^ 1)
    assert ("new", 1) in idx.query(fps[0])
    assert idx.delete(["new", ids[0]]) == 2
    assert [i for i, _ in idx.query(fps[0], k=1)] == []
    path = tmp_path / "x.ndx"
    idx.save(path)
    again = neardup.Index.load(path)
    assert len(again) == len(idx) and again.query(fps[5]) == idx.query(fps[5])


def test_index_files_are_shared_with_the_cli(tmp_path):
    path = tmp_path / "sample.ndx"
    cli("index", "build", str(SAMPLE), "-o", str(path), "-q")
    idx = neardup.Index.load(path)
    docs = sample_docs()
    text = docs[0]["text"]
    want = json.loads(cli("query", str(path), "--text", text))["matches"]
    assert idx.query(text) == [(m["id"], m["distance"]) for m in want]
    assert idx.config == neardup.FingerprintConfig()
    # And the CLI reads what Python writes.
    fps = neardup.fingerprints([d["text"] for d in docs])
    mine = tmp_path / "py.ndx"
    neardup.Index.build(fps, ids=[d["id"] for d in docs], config=neardup.FingerprintConfig()).save(mine)
    got = json.loads(cli("query", str(mine), "--text", text))["matches"]
    assert got == want
    # Compressed tables (both codings) open too, answer the same, and refuse
    # changes.
    assert not idx.compressed
    for coding in ["elias-fano", "gaps"]:
        packed = tmp_path / f"packed-{coding}.ndx"
        cli("index", "build", str(SAMPLE), "-o", str(packed), "--compressed", "--coding", coding, "-q")
        c = neardup.Index.load(packed)
        assert c.compressed and len(c) == len(idx) and c.config == idx.config
        for d in docs[:20]:
            assert c.query(d["text"]) == idx.query(d["text"])
        def pairs(i):
            return {(frozenset((a, b)), d) for a, b, d in i.self_join()}

        assert pairs(c) == pairs(idx)
        with pytest.raises(neardup.NeardupError, match="read-only"):
            c.add("x", 1)


def test_index_built_from_texts_uses_its_configuration(tmp_path):
    # The README's example: a configuration other than the default. Built from
    # texts, the index fingerprints them with it, so text queries find them,
    # as the CLI's index built with the same flags does.
    docs = sample_docs()
    texts, ids = [d["text"] for d in docs], [d["id"] for d in docs]
    cfg = neardup.FingerprintConfig(features="tokens", bits=128)
    idx = neardup.Index.build(texts=texts, ids=ids, k=3, config=cfg)
    assert idx.config == cfg and idx.bits == 128
    assert (ids[0], 0) in idx.query(texts[0])
    path = tmp_path / "cli.ndx"
    cli("index", "build", str(SAMPLE), "-o", str(path), "--features", "tokens", "--bits", "128", "--k", "3", "-q")
    want = json.loads(cli("query", str(path), "--text", texts[0]))["matches"]
    assert idx.query(texts[0]) == [(m["id"], m["distance"]) for m in want]
    with pytest.raises(neardup.NeardupError):
        neardup.Index.build(texts=texts, config=cfg, bits=64)
    with pytest.raises(TypeError):
        neardup.Index.build(neardup.fingerprints(texts), texts=texts)


def test_index_verifies_text_queries_like_the_service(tmp_path):
    base = ("The harbour master opened the gates at dawn, and the fishing boats went out one by one "
            "into the grey morning sea, past the old lighthouse where the keeper was painting the "
            "railings white again, as he did every spring before the summer visitors arrived.")
    reordered = " ".join(reversed(base.split()))
    near = base.replace("painting", "repainting")
    cfg = neardup.FingerprintConfig(features="tokens", bits=64)
    idx = neardup.Index.build(texts=[base], ids=["base"], k=6, config=cfg)
    # Same words in another order: one fingerprint, but not a near-duplicate.
    assert idx.query(reordered) == [("base", 0)]
    assert idx.query(reordered, verify=0.8) == []
    [(i, d, j)] = idx.query(near, verify=0.8)
    assert i == "base" and 0.8 <= j < 1.0
    # Added by text: verified too; by fingerprint: kept by distance alone.
    idx.add("again", base)
    idx.add("bare", neardup.fingerprint(base, features="tokens"))
    got = {i: j for i, _, j in idx.query(base, verify=0.8)}
    assert got == {"base": 1.0, "again": 1.0, "bare": None}
    with pytest.raises(TypeError):
        idx.query(neardup.fingerprint(base, features="tokens"), verify=0.8)
    with pytest.raises(neardup.NeardupError):
        idx.query(base, verify=1.5)
    # Index files keep no sketches: a loaded index says so.
    idx.save(tmp_path / "v.ndx")
    with pytest.raises(neardup.NeardupError, match="sketches"):
        neardup.Index.load(tmp_path / "v.ndx").query(base, verify=0.8)


def test_dedup_equals_the_cli(tmp_path):
    docs = sample_docs()
    texts, ids = [d["text"] for d in docs], [d["id"] for d in docs]
    for flags, kwargs in [
        ([], {}),
        (["--no-centre"], {"centre": False}),
        (["--no-verify"], {"verify": False}),
        (["--policy", "incremental", "--k", "10"], {"policy": "incremental", "k": 10}),
    ]:
        pairs_file, clusters_file = tmp_path / "p.jsonl", tmp_path / "c.jsonl"
        cli("dedup", str(SAMPLE), "--pairs", str(pairs_file), "--clusters", str(clusters_file), "-q", *flags)
        want_pairs = sorted((p["a"], p["b"], p["distance"]) for p in map(json.loads, pairs_file.read_text().splitlines()))
        want_clusters = [(c["representative"], c["members"]) for c in map(json.loads, clusters_file.read_text().splitlines())]
        r = neardup.dedup(texts, ids=ids, **kwargs)
        assert sorted((a, b, d) for a, b, d, _ in r.pairs) == want_pairs, flags
        assert r.clusters == want_clusters, flags
        assert int(r.keep.sum()) == len(docs) - sum(len(m) - 1 for _, m in want_clusters)
    # From fingerprints: as `neardup dedup --fingerprints`.
    fps_file = tmp_path / "f.jsonl"
    fps_file.write_text(cli("fingerprint", str(SAMPLE)))
    cli("dedup", "--fingerprints", str(fps_file), "--pairs", str(tmp_path / "p.jsonl"), "-q")
    want = sorted((p["a"], p["b"], p["distance"]) for p in map(json.loads, (tmp_path / "p.jsonl").read_text().splitlines()))
    r = neardup.dedup(fingerprints=neardup.fingerprints(texts), ids=ids)
    assert sorted((a, b, d) for a, b, d, _ in r.pairs) == want
    assert all(j is None for *_, j in r.pairs)
    with pytest.raises(neardup.NeardupError, match="jaccard"):
        neardup.dedup(texts, verify="cosine:0.8")


def test_docstring_examples_run():
    import doctest

    result = doctest.testmod(neardup, extraglobs={"neardup": neardup}, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 5 and result.failed == 0


@pytest.mark.parametrize("bits", [64, 128])
def test_distance_and_similarity_match_their_definitions(bits):
    rng = random.Random(bits + 1)
    for _ in range(200):
        a, b = rng.getrandbits(bits), rng.getrandbits(bits)
        d = bin(a ^ b).count("1")
        assert neardup.distance(a, b, bits) == d
        assert abs(neardup.similarity(a, b, bits) - math.cos(math.pi * d / bits)) < 1e-12


def test_verify_rules_are_the_command_lines():
    assert neardup.dedup(["a b c d", "a b c d"], verify="jaccard:0.5").pairs
    # A bare threshold is Jaccard's, as the command line's --verify 0.8.
    assert neardup.dedup(["a b c d", "a b c d"], verify="0.5").pairs
    for bad in ["jaccard:1.5", "jaccard:x", "cosine:0.5", "1.5"]:
        with pytest.raises(neardup.NeardupError, match="jaccard:T"):
            neardup.dedup(["a b c d", "a b c d"], verify=bad)
