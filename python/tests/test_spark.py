"""The Spark job in local mode (local[2], loopback only) gives the same pairs and
clusters as `neardup dedup` on a corpus of 20,000 documents with planted
near-duplicates, with and without verification, and a giant cluster of copies
is split across tasks."""

import json
import os
import random
import subprocess

import pytest


def neardup_bin():
    return os.environ["NEARDUP_BIN"]


if os.environ.get("NEARDUP_REQUIRE_SPARK") != "1":
    pytest.importorskip("pyspark")

N_BASE = 16_000
N_DUPS = 4_000


def make_corpus(path, seed=11):
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(6000)]
    weights = [1.0 / (i + 1) ** 0.9 for i in range(len(vocab))]
    docs = []
    for i in range(N_BASE):
        words = rng.choices(vocab, weights, k=rng.randrange(60, 200))
        docs.append((f"doc-{i}", words))
    for j in range(N_DUPS):
        base_id, words = docs[rng.randrange(N_BASE)]
        words = list(words)
        kind = rng.choice(["edit", "truncate", "boilerplate", "copy"])
        if kind == "edit":
            for _ in range(max(1, len(words) * rng.choice([1, 2, 4]) // 100)):
                words[rng.randrange(len(words))] = rng.choice(vocab)
        elif kind == "truncate":
            words = words[: int(len(words) * rng.choice([0.97, 0.92, 0.85]))]
        elif kind == "boilerplate":
            words = ["home", "about", "contact", "login"] + words
        docs.append((f"dup-{j}-of-{base_id}", words))
    rng.shuffle(docs)
    # A giant cluster: 300 identical copies (the skew case, with max_group below it).
    docs += [(f"copy-{c}", ["the", "same", "page", "again"] * 20) for c in range(300)]
    with open(path, "w") as f:
        for doc_id, words in docs:
            f.write(json.dumps({"id": doc_id, "text": " ".join(words), "lang": "x"}) + "\n")
    return len(docs)


@pytest.fixture(scope="module")
def spark():
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from neardup.spark import _session

    s = _session("local[2]")
    s.sparkContext.setLogLevel("ERROR")
    yield s
    s.stop()


def cli_dedup(corpus, tmp_path, flags):
    pairs, clusters = tmp_path / "cli-pairs.jsonl", tmp_path / "cli-clusters.jsonl"
    subprocess.run(
        [neardup_bin(), "dedup", str(corpus), "--pairs", str(pairs), "--clusters", str(clusters), "-q", *flags],
        check=True,
    )
    p = sorted((d["a"], d["b"], d["distance"]) for d in map(json.loads, pairs.read_text().splitlines()))
    c = sorted((d["representative"], d["size"], tuple(d["members"])) for d in map(json.loads, clusters.read_text().splitlines()))
    return p, c


@pytest.mark.parametrize("verify", [True, False])
def test_spark_equals_cli(spark, tmp_path, verify):
    from neardup.spark import dedup, write

    corpus = tmp_path / "corpus.jsonl"
    n = make_corpus(corpus)
    assert n >= 20_000
    flags = [] if verify else ["--no-verify"]
    want_pairs, want_clusters = cli_dedup(corpus, tmp_path, flags)
    assert len(want_pairs) > 1000 and len(want_clusters) > 500

    df = spark.read.json(str(corpus))
    result = dedup(spark, df, verify=verify, max_group=64)
    out = tmp_path / "out"
    write(result, str(out), "parquet")
    pairs = spark.read.parquet(str(out / "pairs"))
    assert pairs.columns[:3] == ["a", "b", "distance"]
    got_pairs = sorted((r.a, r.b, r.distance) for r in pairs.collect())
    assert got_pairs == want_pairs
    got_clusters = sorted((r.representative, r.size, tuple(r.members)) for r in spark.read.parquet(str(out / "clusters")).collect())
    assert got_clusters == want_clusters
    deduped = spark.read.parquet(str(out / "deduped"))
    assert deduped.count() == n - sum(size - 1 for _, size, _ in want_clusters)
    assert set(deduped.columns) == {"id", "text", "lang"}


def test_command_line_on_parquet_with_jsonl_output(spark, tmp_path):
    """`python -m neardup.spark dedup` reads Parquet and writes JSON Lines,
    with the same answers as the CLI on the same records."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from neardup.spark import main

    corpus = tmp_path / "c.jsonl"
    rows = [json.loads(l) for l in open(make_small(corpus))]
    table = pa.Table.from_pylist(rows)
    pq.write_table(table, tmp_path / "c.parquet")
    want_pairs, want_clusters = cli_dedup(corpus, tmp_path, ["--no-verify"])
    out = tmp_path / "out"
    assert main(["dedup", "--input", str(tmp_path / "c.parquet"), "--output", str(out), "--format", "jsonl", "--no-verify"]) == 0
    got = sorted(
        (d["a"], d["b"], d["distance"])
        for f in sorted((out / "pairs").glob("part-*"))
        for d in map(json.loads, f.read_text().splitlines())
    )
    assert got == want_pairs
    clusters = [json.loads(l) for f in sorted((out / "clusters").glob("part-*")) for l in f.read_text().splitlines()]
    assert sorted((c["representative"], c["size"], tuple(c["members"])) for c in clusters) == want_clusters
    assert main(["dedup", "--input", str(tmp_path / "c.parquet"), "--output", str(out), "--text-field", "body"]) == 2


def make_small(path):
    rng = random.Random(5)
    docs = []
    for i in range(1500):
        words = [f"v{rng.randrange(3000)}" for _ in range(rng.randrange(40, 120))]
        docs.append({"id": i, "text": " ".join(words)})
        if i % 5 == 0:
            words[rng.randrange(len(words))] = "changed"
            docs.append({"id": 100000 + i, "text": " ".join(words)})
    with open(path, "w") as f:
        for d in docs:
            f.write(json.dumps(d) + "\n")
    return path


def test_spark_vectors_equal_cli(spark, tmp_path):
    """`--vector-column`: dense vectors verified by exact cosine, the same
    pairs and clusters as `neardup dedup --vector-field`."""
    import numpy as np

    from neardup.spark import main

    rng = np.random.default_rng(4)
    x = rng.standard_normal((800, 32)).astype(np.float32)
    x[700:] = x[:100] + 0.08 * rng.standard_normal((100, 32)).astype(np.float32)
    corpus = tmp_path / "v.jsonl"
    with open(corpus, "w") as f:
        for i, row in enumerate(x):
            f.write(json.dumps({"id": f"v{i}", "vector": [float(v) for v in row]}) + "\n")
    want_pairs, want_clusters = cli_dedup(corpus, tmp_path, ["--vector-field", "--min-similarity", "0.96"])
    assert len(want_pairs) >= 90
    out = tmp_path / "out"
    assert main(["dedup", "--input", str(corpus), "--output", str(out), "--format", "jsonl",
                 "--vector-column", "vector", "--min-similarity", "0.96"]) == 0
    pairs = [json.loads(l) for f in sorted((out / "pairs").glob("part-*")) for l in f.read_text().splitlines()]
    assert sorted((d["a"], d["b"], d["distance"]) for d in pairs) == want_pairs
    assert all(d["cosine"] >= 0.96 for d in pairs)
    clusters = [json.loads(l) for f in sorted((out / "clusters").glob("part-*")) for l in f.read_text().splitlines()]
    assert sorted((c["representative"], c["size"], tuple(c["members"])) for c in clusters) == want_clusters
