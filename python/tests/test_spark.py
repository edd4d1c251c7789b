"""The Spark job in local mode (local[2], loopback only) gives the same pairs and
clusters as `neardup dedup` on a corpus of 5,000 documents with planted
near-duplicates, with and without verification, and a giant cluster of copies
is split across tasks."""

import io
import json
import os
import random
import subprocess

import pytest


def neardup_bin():
    return os.environ["NEARDUP_BIN"]


if os.environ.get("NEARDUP_REQUIRE_SPARK") != "1":
    pytest.importorskip("pyspark")

N_BASE = 4_000
N_DUPS = 1_000


def make_corpus(path, seed=11, n_base=N_BASE, n_dups=N_DUPS, near=0):
    """JSON Lines of documents and their edited copies, then 300 identical
    copies of a page and ``near`` near copies of another (a word or two of
    its 200 replaced in each)."""
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(6000)]
    weights = [1.0 / (i + 1) ** 0.9 for i in range(len(vocab))]
    docs = []
    for i in range(n_base):
        words = rng.choices(vocab, weights, k=rng.randrange(60, 200))
        docs.append((f"doc-{i}", words))
    for j in range(n_dups):
        base_id, words = docs[rng.randrange(n_base)]
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
    page = rng.choices(vocab, k=200)
    for c in range(near):
        words = list(page)
        for _ in range(rng.randint(1, 2)):
            words[rng.randrange(len(words))] = f"changed{rng.randrange(10**6)}"
        docs.append((f"near-{c}", words))
    with open(path, "w") as f:
        for doc_id, words in docs:
            f.write(json.dumps({"id": doc_id, "text": " ".join(words), "lang": "x"}) + "\n")
    return len(docs)


@pytest.fixture(scope="module")
def spark():
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from neardup.spark.cli import _session

    s, _ = _session("local[2]")
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


def read_parts(folder):
    return [json.loads(l) for f in sorted(folder.glob("part-*")) for l in f.read_text().splitlines()]


def cli_outputs(corpus, tmp_path, flags):
    """Pairs (with the score rounded as the CLI prints it), clusters and the
    kept records of `neardup dedup`."""
    pairs, clusters, keep = tmp_path / "cli-pairs.jsonl", tmp_path / "cli-clusters.jsonl", tmp_path / "cli-keep.jsonl"
    subprocess.run(
        [neardup_bin(), "dedup", *map(str, corpus), "--pairs", str(pairs), "--clusters", str(clusters), "--keep", str(keep), "-q", *flags],
        check=True,
    )
    return outputs(map(json.loads, pairs.read_text().splitlines()), map(json.loads, clusters.read_text().splitlines()), keep.read_text().splitlines())


def outputs(pairs, clusters, kept):
    p = sorted((d["a"], d["b"], d["distance"], round(d["jaccard"], 4) if "jaccard" in d else None) for d in pairs)
    c = sorted((d["representative"], d["size"], tuple(d["members"])) for d in clusters)
    return p, c, list(kept)


def spark_outputs(out):
    kept = [l for f in sorted((out / "deduped").glob("part-*")) for l in f.read_text().splitlines()]
    return outputs(read_parts(out / "pairs"), read_parts(out / "clusters"), kept)


@pytest.mark.parametrize("verify,reader,driver", [(True, "executors", False), (True, "executors", True), (True, "spark", False),
                                                (True, "spark", True), (False, "gzip", False)])
def test_spark_equals_cli(spark, tmp_path, monkeypatch, capsys, verify, reader, driver):
    """The command line on JSON Lines: the same pairs, clusters and kept
    records (the lines unchanged, in input order) as `neardup dedup`, whether
    the executors read the file themselves (in byte ranges of 64 KB here, so
    that many lines straddle two) or Spark reads it (asked to, or because it
    is compressed), and whether the executors join (the default) or the
    driver does (``--driver-documents``)."""
    import gzip

    from neardup.spark import LocalSplits, main

    corpus = tmp_path / "corpus.jsonl"
    make_corpus(corpus)
    monkeypatch.setattr(LocalSplits, "smallest", 64 << 10)
    if reader == "spark":
        monkeypatch.setenv("NEARDUP_SPARK_READER", "spark")
    if reader == "gzip":
        packed = tmp_path / "corpus.jsonl.gz"
        packed.write_bytes(gzip.compress(corpus.read_bytes()))
        corpus = packed
    flags = [] if verify else ["--no-verify"]
    want = cli_outputs([corpus], tmp_path, flags)
    assert len(want[0]) > 250 and len(want[1]) > 125
    out = tmp_path / "out"
    path = ["--driver-documents", "1000000"] if driver else []
    assert main(["dedup", "--input", str(corpus), "--output", str(out), "--format", "jsonl", *flags, *path]) == 0
    said = capsys.readouterr().err
    assert ("the executors join them" in said) == (not driver), said
    got = spark_outputs(out)
    assert got[0] == want[0]
    assert got[1] == want[1]
    assert got[2] == want[2]


@pytest.mark.parametrize("pairs", [True, False], ids=["pairs", "no-pairs"])
def test_distributed_path_equals_cli(spark, tmp_path, monkeypatch, pairs):
    """The executors' join (the default, asked for here with a driver limit
    of 0; groups keyed by a part of the fingerprint, the skewed ones split
    into block pairs): by
    the DataFrame API, the same pairs and clusters; by the command line
    without the pairs (its executors reading the file), the same clusters
    and kept records from one pair per copy of the 300 identical documents,
    and from pairs checked in their groups for the 200 near copies of one
    page (their summaries leave most undecided), their feature sets' cache
    emptied at every group."""
    import neardup.spark.candidates as candidates
    from neardup.spark import dedup, main, write

    monkeypatch.setattr(candidates, "SPAN_CACHE_BYTES", 0)

    corpus = tmp_path / "corpus.jsonl"
    # A smaller corpus: the distributed path runs several Spark jobs a round.
    n = make_corpus(corpus, n_base=1_500, n_dups=500, near=200)
    if not pairs:
        want = cli_outputs([corpus], tmp_path, [])
        near = sum(1 for a, b, *_ in want[0] if a.startswith("near-") and b.startswith("near-"))
        copies = sum(1 for a, b, *_ in want[0] if a.startswith("copy-") and b.startswith("copy-"))
        assert near > 19_000 and copies == 44_850
        out, report = tmp_path / "out", tmp_path / "report.json"
        assert main(["dedup", "--input", str(corpus), "--output", str(out), "--format", "jsonl", "-q", "--no-pairs",
                     "--driver-documents", "0", "--max-group", "64", "--report", str(report)]) == 0
        assert not (out / "pairs").exists()
        kept = [l for f in sorted((out / "deduped").glob("part-*")) for l in f.read_text().splitlines()]
        assert outputs([], read_parts(out / "clusters"), kept)[1:] == want[1:]
        # The copies: 299 pairs, not 44,850; the near copies: at most 199 in
        # each block pair of each group they share, not 19,900.
        stages = {st["stage"]: st for st in json.loads(report.read_text())["stages"]}
        assert stages["verify"]["verified"] < len(want[0]) - copies - near + 6_000
        return
    want_pairs, want_clusters = cli_dedup(corpus, tmp_path, [])
    df = spark.read.json(str(corpus))
    result = dedup(spark, df, max_group=64, driver_documents=0)
    out = tmp_path / "out"
    write(result, str(out), "parquet")
    got = spark.read.parquet(str(out / "pairs"))
    assert got.columns[:3] == ["a", "b", "distance"]
    assert sorted((r.a, r.b, r.distance) for r in got.collect()) == want_pairs
    got_clusters = sorted((r.representative, r.size, tuple(r.members)) for r in spark.read.parquet(str(out / "clusters")).collect())
    assert got_clusters == want_clusters
    deduped = spark.read.parquet(str(out / "deduped"))
    assert deduped.count() == n - sum(size - 1 for _, size, _ in want_clusters)
    assert set(deduped.columns) == {"id", "text", "lang"}


@pytest.mark.parametrize("one_task", [True, False], ids=["one-task", "star-rounds"])
def test_components_of_random_graphs(spark, monkeypatch, one_task):
    """Connected components of the distributed path, finished in one task
    or by large-star/small-star rounds (after each partition's union-find),
    against a union-find on the driver: every node's component's smallest
    node."""
    import neardup.spark.components as S

    if not one_task:
        monkeypatch.setattr(S, "ONE_TASK_EDGES", 0)
    rng = random.Random(3)
    # Chains (long paths need rounds), stars, and pairs, on sparse ids.
    nodes = rng.sample(range(10**9), 400)
    edges = [(nodes[i], nodes[i + 1]) for i in range(0, 120)]
    edges += [(nodes[200], nodes[j]) for j in range(201, 260)]
    edges += [tuple(nodes[x] for x in rng.sample(range(260, 400), 2)) for _ in range(90)]
    rng.shuffle(edges)
    parent = {x: x for e in edges for x in e}

    def find(x):
        while parent[x] != x:
            x = parent[x]
        return x

    for a, b in edges:
        ra, rb = find(a), find(b)
        parent[max(ra, rb)] = min(ra, rb)
    members = {}
    for x in parent:
        members.setdefault(find(x), []).append(x)
    want = {x: min(m) for m in members.values() for x in m}
    df = spark.createDataFrame(edges, "a long, b long").repartition(3)
    got = {r["_pos"]: r["rep"] for r in S._components(spark, df).collect()}
    assert got == want


@pytest.mark.parametrize("ids", ["str", "int"])
def test_distributed_command_line_equals_cli(spark, tmp_path, ids):
    """The command line above its --driver-documents limit, on JSON Lines
    with blank lines and both kinds of id, each cluster's record kept by a
    rule: the CLI's pairs, clusters and kept lines."""
    from neardup.spark import main

    corpus = make_mixed(tmp_path / "mixed.jsonl", seed=5, n=1500, ids=ids)
    # Each cluster's kept record by a rule: a field, or the longest text.
    flags = ["--keep-by", "field:quality:desc"] if ids == "str" else ["--keep-by", "longest"]
    want = cli_outputs([corpus], tmp_path, flags)
    assert len(want[0]) > 100
    out, report = tmp_path / "out", tmp_path / "report.json"
    assert main(["dedup", "--input", str(corpus), "--output", str(out), "--format", "jsonl", "-q",
                 "--driver-documents", "0", "--max-group", "64", "--report", str(report), *flags]) == 0
    got = spark_outputs(out)
    assert got[0] == want[0]
    assert got[1] == want[1]
    # The join's tasks checked their undecided pairs themselves (the
    # feature sets kept by the fingerprint pass): the counts they sent.
    by = {st["stage"]: st for st in json.loads(report.read_text())["stages"]}
    assert by["verify"]["verified"] == len(want[0])
    assert len(want[0]) <= by["candidates"]["pairs"] and 0 < by["candidates"]["undecided"] <= by["candidates"]["pairs"]
    assert got[2] == want[2]
    # What the distributed path cannot do is refused, not done differently.
    assert main(["dedup", "--input", str(corpus), "--output", str(out), "--format", "jsonl", "-q",
                 "--driver-documents", "0", "--policy", "incremental"]) == 2


@pytest.mark.parametrize(
    "flags,reader",
    [([], "executors"), (["--keep-by", "field:quality:desc", "--no-pairs"], "spark")],
    ids=["pairs", "field-no-pairs-spark-reader"],
)
def test_distributed_against_equals_cli(spark, tmp_path, capsys, monkeypatch, flags, reader):
    """The batch mode on the distributed path: new documents against an
    existing set whose clusters they reach (copies of one original on both
    sides, some only near the original): the pairs with a new document,
    the clusters with a new member (old members reached through other old
    ones included) and the kept new records of `neardup dedup --against`,
    whether the executors read the files or Spark does."""
    from neardup.spark import main

    if reader == "spark":
        monkeypatch.setenv("NEARDUP_SPARK_READER", "spark")

    lines = make_clusters(tmp_path / "clusters.jsonl").read_text().splitlines(keepends=True)
    random.Random(4).shuffle(lines)
    old, new = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
    old.write_text("".join(lines[: len(lines) * 2 // 3]))
    new.write_text("".join(lines[len(lines) * 2 // 3 :]))
    flags = ["--against", str(old), *flags]
    want = cli_outputs([new], tmp_path, [f for f in flags if f != "--no-pairs"])
    assert len(want[1]) > 30 and max(size for _, size, _ in want[1]) > 8
    out = tmp_path / "out"
    assert main(["dedup", "--input", str(new), "--output", str(out), "--format", "jsonl", "--driver-documents", "0",
                 *flags]) == 0
    said = capsys.readouterr().err
    assert "old documents looked up in the" in said and "of lookups" in said, said
    if "--no-pairs" in flags:
        got = (want[0], *spark_outputs_no_pairs(out))
    else:
        got = spark_outputs(out)
    assert got[0] == want[0]
    assert got[1] == want[1]
    assert got[2] == want[2]


def make_clusters(path, seed=21):
    """Originals with many copies each, edited at rates that put some copies
    above the Jaccard threshold and others just below it (near misses): large
    clusters, and candidate pairs that fail their check."""
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(5000)]
    with open(path, "w") as f:
        for o in range(40):
            words = [rng.choice(vocab) for _ in range(150)]
            f.write(json.dumps({"id": f"o{o}", "text": " ".join(words), "quality": rng.randrange(100)}) + "\n")
            for c in range(16):
                rate = rng.choice([0.01, 0.02, 0.04, 0.06, 0.08])
                copy = [rng.choice(vocab) if rng.random() < rate else w for w in words]
                f.write(json.dumps({"id": f"o{o}c{c}", "text": " ".join(copy), "quality": rng.randrange(100)}) + "\n")
    return path


@pytest.mark.parametrize("budget", [5, 10_000_000], ids=["many-rounds", "one-round"])
@pytest.mark.parametrize("flags", [[], ["--keep-by", "field:quality:desc"]], ids=["first", "field"])
def test_no_pairs_gives_the_cli_clusters(spark, tmp_path, monkeypatch, capsys, budget, flags):
    """--no-pairs on the driver join verifies only pairs that span the
    clusters, in rounds of the join when the undecided pairs overflow the
    budget (a budget of 5 forces many): the clusters and kept records of
    `neardup dedup`."""
    import neardup.spark.driver as driver
    from neardup.spark import main

    monkeypatch.setattr(driver, "SPAN_BUDGET", budget)
    corpus = make_clusters(tmp_path / "clusters.jsonl")
    want = cli_outputs([corpus], tmp_path, flags)
    out = tmp_path / "out"
    assert main(["dedup", "--input", str(corpus), "--output", str(out), "--format", "jsonl", "--no-pairs",
                 "--driver-documents", "1000000", *flags]) == 0
    assert not (out / "pairs").exists()
    said = capsys.readouterr().err
    assert ("in 1 round of the join" in said) == (budget > 5), said
    kept = [l for f in sorted((out / "deduped").glob("part-*")) for l in f.read_text().splitlines()]
    got = outputs([], read_parts(out / "clusters"), kept)
    assert len(want[1]) > 20 and max(size for _, size, _ in want[1]) > 5
    assert got[1] == want[1]
    assert got[2] == want[2]


def make_mixed(path, seed=3, n=2500, ids="str"):
    """English-like and Chinese records with planted near-copies of varied
    length, a numeric quality field, and blank lines."""
    rng = random.Random(seed)
    han = [chr(0x4E00 + i) for i in range(0, 3000, 7)]
    docs = []
    for i in range(n):
        if i % 4 == 0:
            words = "".join(rng.choice(han) for _ in range(rng.randrange(80, 300)))
            text = "。".join(words[x : x + 20] for x in range(0, len(words), 20))
        else:
            text = " ".join(f"w{rng.randrange(2000)}" for _ in range(rng.randrange(50, 160)))
        docs.append({"id": f"d{i}" if ids == "str" else i, "text": text, "quality": rng.randrange(100)})
        if i % 3 == 0:
            cut = text[: int(len(text) * rng.choice([0.9, 0.95, 1.0]))] + rng.choice(["", " extra", "附加"])
            docs.append({"id": f"c{i}" if ids == "str" else 10**6 + i, "text": cut, "quality": rng.randrange(100)})
    rng.shuffle(docs)
    with open(path, "w") as f:
        for x, d in enumerate(docs):
            f.write(json.dumps(d, ensure_ascii=x % 2 == 0) + "\n")
            if x % 500 == 0:
                f.write("\n")
    return path


@pytest.mark.parametrize(
    "flags",
    [
        ["--keep-by", "longest", "--policy", "incremental"],
        ["--keep-by", "field:quality:desc"],
        ["--bits", "64", "--features", "shingles:2", "--no-verify", "--k", "4"],
        ["--weights", "tfidf", "--idf", "IDF"],
        ["--against", "OLD"],
        ["--against", "OLD", "DRIVER"],
    ],
    ids=["longest-incremental", "field-desc", "shingles-64-unverified", "tfidf-learned", "against", "against-driver"],
)
def test_options_equal_cli(spark, tmp_path, flags):
    """Every option set gives the CLI's pairs, clusters and kept records (on
    the driver join when only it takes the options, or when asked to:
    DRIVER)."""
    from neardup.spark import main

    corpus = make_mixed(tmp_path / "mixed.jsonl", ids="int" if "--against" in flags else "str")
    inputs = [corpus]
    path = ["--driver-documents", "1000000"] if "DRIVER" in flags else []
    flags = [f for f in flags if f != "DRIVER"]
    if "IDF" in flags:
        idf = tmp_path / "idf.tsv"
        # Learned from the features verification's candidates use (single tokens, UAX #29 words).
        subprocess.run([neardup_bin(), "idf", "build", str(corpus), "--features", "tokens", "--tokenizer", "words", "-o", str(idf), "-q"], check=True)
        flags[flags.index("IDF")] = str(idf)
    if "OLD" in flags:
        lines = corpus.read_text().splitlines(keepends=True)
        old, new = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
        old.write_text("".join(lines[: len(lines) // 2]))
        new.write_text("".join(lines[len(lines) // 2 :]))
        flags[flags.index("OLD")] = str(old)
        inputs = [new]
    want = cli_outputs(inputs, tmp_path, flags)
    assert len(want[1]) > 50
    out = tmp_path / "out"
    assert main(["dedup", "--input", *map(str, inputs), "--output", str(out), "--format", "jsonl", "-q", *flags, *path]) == 0
    got = spark_outputs(out)
    assert got[0] == want[0]
    assert got[1] == want[1]
    assert got[2] == want[2]


def test_bad_input_is_a_clear_error(spark, tmp_path, capsys):
    """A malformed record fails the job with its place and the fix;
    --skip-invalid skips and counts it; a missing file is named."""
    from neardup.spark import main

    corpus = tmp_path / "bad.jsonl"
    corpus.write_text('{"id": 1, "text": "one two three"}\n{"id": 2, "text": \n{"id": 3, "text": "four five six"}\n')
    out = tmp_path / "out"
    assert main(["dedup", "--input", str(corpus), "--output", str(out), "-q"]) == 2
    err = capsys.readouterr().err
    assert "malformed JSON line" in err and "--skip-invalid" in err and "Traceback" not in err
    assert not (out / "deduped").exists()
    assert main(["dedup", "--input", str(corpus), "--output", str(out), "--format", "jsonl", "--skip-invalid", "-q"]) == 0
    assert sorted(json.loads(l)["id"] for f in (out / "deduped").glob("part-*") for l in f.read_text().splitlines()) == [1, 3]
    assert main(["dedup", "--input", str(tmp_path / "missing.jsonl"), "--output", str(out)]) == 2
    assert "missing.jsonl: no such file" in capsys.readouterr().err


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


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_standalone_cluster_equals_cli(tmp_path):
    """A standalone master and one worker on 127.0.0.1 (started with
    spark-class, as the pip package ships no start scripts), the job sent
    with spark-submit and the built wheel (``NEARDUP_WHEEL``, else built
    here): the driver imports the package from the unpacked wheel, the
    executor from the wheel shipped with ``--archives``. The distributed
    path gives the CLI's pairs, clusters and kept records, the driver in 512
    MB, and its report. Both daemons are stopped by process id."""
    import glob
    import shutil
    import socket
    import sys
    import time
    import zipfile

    import pyspark

    home = os.path.dirname(pyspark.__file__)
    wheel = os.environ.get("NEARDUP_WHEEL")
    if not wheel:
        root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(tmp_path / "dist"), root],
                       check=True, timeout=1800)
        (wheel,) = glob.glob(str(tmp_path / "dist" / "neardup-*.whl"))
    # Spark unpacks archives by their extension: the wheel is a zip.
    shipped = tmp_path / "neardup-wheel.zip"
    shutil.copy(wheel, shipped)
    unpacked = tmp_path / "driver-wheel"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(unpacked)
    script = unpacked / "neardup" / "spark" / "__main__.py"

    corpus = make_mixed(tmp_path / "mixed.jsonl", seed=8, n=1500)
    want = cli_outputs([corpus], tmp_path, [])
    env = {**os.environ, "SPARK_HOME": home, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable, "SPARK_WORKER_DIR": str(tmp_path / "work"), "SPARK_LOG_DIR": str(tmp_path / "logs"),
           "PYTHONPATH": str(unpacked)}
    port = free_port()
    cls = os.path.join(home, "bin", "spark-class")
    logs = open(tmp_path / "daemons.log", "w")
    master = subprocess.Popen([cls, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                               "--webui-port", str(free_port())], env=env, stdout=logs, stderr=logs)
    worker = None
    try:
        for _ in range(120):  # bounded: at most a minute for the master to listen
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.5)
        else:
            pytest.fail("the standalone master did not start: " + (tmp_path / "daemons.log").read_text()[-2000:])
        worker = subprocess.Popen([cls, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "2", "--memory", "2g",
                                   "--webui-port", str(free_port()), f"spark://127.0.0.1:{port}"], env=env, stdout=logs, stderr=logs)
        def submit(out, *args):
            return subprocess.run(
                [os.path.join(home, "bin", "spark-submit"), "--master", f"spark://127.0.0.1:{port}", "--driver-memory", "512m",
                 "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1", "--conf", "spark.ui.enabled=false",
                 "--executor-memory", "1g", "--archives", f"{shipped}#neardup_wheel", "--conf", "spark.executorEnv.PYTHONPATH=neardup_wheel",
                 str(script), "dedup", *args, "--output", str(out), "--format", "jsonl"],
                env=env, capture_output=True, text=True, timeout=600,
            )

        out = tmp_path / "out"
        # The distributed path: nothing per document on the driver.
        report = tmp_path / "report.json"
        r = submit(out, "--input", str(corpus), "--driver-documents", "0", "--report", str(report))
        assert r.returncode == 0, r.stderr[-3000:]
        # Quiet: the log is at WARN from the session's start (only the JVM's
        # start-up says INFO), one line per stage and the summary.
        assert r.stderr.count(" INFO ") < 150, r.stderr.count(" INFO ")
        said = r.stdout + r.stderr  # spark-submit passes the driver's stderr on to its stdout
        assert "neardup.spark: done in" in said and "neardup.spark: verify:" in said
        # The output is on a file system every executor writes: the feature
        # sets were kept beside it (the join's tasks checked their pairs),
        # and the folder is gone.
        assert "checked exactly by the same tasks" in said, said[-3000:]
        assert not [p for p in os.listdir(tmp_path) if p.startswith("neardup-spill-")], os.listdir(tmp_path)
        got = spark_outputs(out)
        assert got[0] == want[0]
        assert got[1] == want[1]
        assert got[2] == want[2]
        # The report: every stage, the rows the outputs show, the candidate
        # stage's shuffle (k + 1 keyed rows a document), its longest task
        # and the driver's memory.
        rep = json.loads(report.read_text())
        assert [st["stage"] for st in rep["stages"]] == ["fingerprint", "candidates", "verify", "components", "write"]
        by = {st["stage"]: st for st in rep["stages"]}
        assert rep["documents"] == sum(1 for l in corpus.read_text().splitlines() if l.strip())
        assert by["verify"]["verified"] == len(want[0])
        assert by["components"]["removed"] == sum(size - 1 for _, size, _ in want[1])
        assert by["candidates"]["shuffle_bytes_per_document"] > 100
        # Each stage's longest task beside its Spark stage's median (skew).
        task = by["candidates"]["longest_task"]
        assert task["tasks"] >= 2 and task["longest_task_seconds"] >= task["median_task_seconds"] >= 0, task
        assert 0 < rep["driver"]["python_peak_bytes"] and 0 < rep["driver"]["jvm_peak_bytes"]
        # The executor had the wheel, unpacked in its working directory.
        assert glob.glob(str(tmp_path / "work" / "app-*" / "*" / "neardup_wheel" / "neardup" / "_neardup*.so")), \
            sorted(glob.glob(str(tmp_path / "work" / "**"), recursive=True))[:40]
    finally:
        for p in (worker, master):
            if p is not None:
                p.terminate()
        for p in (worker, master):
            if p is not None:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        logs.close()


@pytest.mark.parametrize("cap", [2, 5, 1000])
@pytest.mark.parametrize("seed", range(6))
def test_exact_check_routes_each_pair_with_both_documents(cap, seed):
    """The exact check's plan (no Spark needed): every undecided pair is in
    exactly one bucket, both its documents are routed there, a connected
    group of at most `cap` documents shares one bucket, and no document goes
    to a bucket none of its pairs is in; checked against a direct model."""
    import numpy as np
    from neardup.spark.verify import _buckets

    rng = random.Random(seed)
    n = rng.randrange(2, 60)
    pairs = {tuple(sorted(rng.sample(range(n), 2))) for _ in range(rng.randrange(1, 120))}
    undecided = np.array([(a, b, rng.randrange(16)) for a, b in sorted(pairs)], dtype=np.int64)
    plan = _buckets(undecided, cap=cap)
    docs, starts = plan["docs"], plan["starts"]
    assert list(docs) == sorted({d for p in pairs for d in p})
    assert starts[0] == 0 and starts[-1] == len(pairs) and all(np.diff(starts) >= 0)
    bucket_of_pair = {}
    for bucket in range(plan["buckets"]):
        for x in range(starts[bucket], starts[bucket + 1]):
            key = (int(docs[plan["i"][x]]), int(docs[plan["j"][x]]))
            assert key not in bucket_of_pair
            bucket_of_pair[key] = (bucket, int(plan["d"][x]))
    assert {k: d for k, (_, d) in bucket_of_pair.items()} == {(int(a), int(b)): int(d) for a, b, d in undecided}
    routes = {(int(docs[d]), int(b)) for d, b in zip(plan["route_doc"], plan["route_bucket"])}
    assert len(routes) == len(plan["route_doc"])  # one route per document and bucket
    needed = {(d, b) for (a, c), (b, _) in bucket_of_pair.items() for d in (a, c)}
    assert routes == needed
    # Connected groups (by a direct union-find) of at most `cap` documents: one bucket.
    parent = list(range(n))

    def find(x):
        while parent[x] != x:
            x = parent[x]
        return x

    for a, b in pairs:
        parent[find(a)] = find(b)
    groups = {}
    for a, b in pairs:
        groups.setdefault(find(a), set()).update((a, b))
    for root, members in groups.items():
        if len(members) <= cap:
            assert len({bucket_of_pair[p][0] for p in pairs if find(p[0]) == root}) == 1


def test_spark_hash_of_longs_is_sparks_own(spark):
    """The driver's Murmur3 of long values gives what Spark's ``hash()``
    gives, for small, large and negative values."""
    import numpy as np
    from neardup.spark.candidates import _spark_hash

    rng = np.random.default_rng(5)
    values = np.concatenate([np.arange(-300, 300), rng.integers(-(1 << 63), (1 << 63) - 1, size=400, dtype=np.int64),
                             np.array([-(1 << 63), (1 << 63) - 1, 1 << 32, (1 << 32) - 1], dtype=np.int64)])
    frame = spark.createDataFrame([(int(v),) for v in values], "v long")
    want = [r[0] for r in frame.selectExpr("hash(v)").collect()]
    assert _spark_hash(values).tolist() == want


@pytest.mark.parametrize("parts", [3, 2000, 20011])
def test_partition_values_are_the_smallest_of_their_partitions(parts):
    """Each task's value is the smallest long that Spark's partitioning
    (``pmod(hash(v), parts)``, its hash checked against Spark's above)
    sends to that task: no Spark needed, so many tasks are cheap to check."""
    import numpy as np
    from neardup.spark.candidates import _partition_values, _spark_hash

    values = np.array(_partition_values(parts), dtype=np.int64)
    assert (np.mod(_spark_hash(values).astype(np.int64), parts) == np.arange(parts)).all()
    span = np.arange(int(values.max()) + 1, dtype=np.int64)
    part = np.mod(_spark_hash(span).astype(np.int64), parts)
    first = {}
    for v, p in zip(span.tolist(), part.tolist()):
        first.setdefault(p, v)
    assert [first[p] for p in range(parts)] == values.tolist()


@pytest.mark.parametrize("parts", [1, 2, 7, 64])
def test_each_task_of_the_join_gets_the_records_sent_to_it(spark, parts):
    """The candidate join's shuffle sends each routed buffer by a value
    that Spark's hash partitioning maps to the task the router chose: each
    of the ``parts`` values lands alone in its own partition."""
    from neardup.spark.candidates import _partition_values

    values = _partition_values(parts)
    assert len(set(values)) == parts
    frame = spark.createDataFrame([(v, i) for i, v in enumerate(values)], "dest long, task long")
    placed = frame.repartition(parts, "dest").rdd.mapPartitionsWithIndex(lambda p, rows: [(p, r.task) for r in rows]).collect()
    assert sorted(placed) == [(i, i) for i in range(parts)]


@pytest.mark.parametrize("lean", [False, True])
@pytest.mark.parametrize("seed", range(30))
def test_routed_records_join_as_the_pigeonhole_groups_do(seed, lean):
    """The distributed join's shuffle (no Spark needed): documents routed to
    a few tasks as packed records (with each task's documents once, or
    lean: every row holding its document), each task's records (in any
    order) joined on their own, give exactly the pairs within k of a
    brute-force comparison, each once, whatever the number of tasks and
    with hot groups split into salted blocks."""
    import numpy as np
    from neardup import _neardup as _rs

    rng = random.Random(seed)
    bits, k = rng.choice([(64, 3), (64, 7), (128, 19)])
    base = [rng.getrandbits(bits) for _ in range(rng.randrange(1, 6))]
    fps = []
    for _ in range(rng.randrange(2, 120)):
        f = rng.choice(base)
        for _ in range(rng.randrange(0, k + 3)):
            f ^= 1 << rng.randrange(bits)
        fps.append(f)
    n = len(fps)
    words = b"".join(((f >> 64) & (2**64 - 1)).to_bytes(8, "little") + (f & (2**64 - 1)).to_bytes(8, "little") for f in fps)
    pos = [rng.randrange(1 << 40) for _ in range(n)]
    pos = sorted(set(pos))
    while len(pos) < n:
        pos.append(pos[-1] + 1)
    pos_bytes = b"".join(p.to_bytes(8, "little") for p in pos)
    keys = np.frombuffer(_rs.pigeonhole_keys(words, bits, k), dtype="<i8")
    distinct, counts = np.unique(keys, return_counts=True)
    hot = [(int(key), rng.randrange(2, 5)) for key, c in zip(distinct, counts) if c > 3 and rng.random() < 0.5]
    hot_keys = np.array([h for h, _ in hot], dtype="<i8").tobytes()
    hot_splits = np.array([s for _, s in hot], dtype="<i8").tobytes()
    parts = rng.randrange(1, 6)
    tasks = [[] for _ in range(parts)]
    for start in range(0, n, 17):  # map batches of 17 documents
        end = min(n, start + 17)
        args = (words[16 * start:16 * end], pos_bytes[8 * start:8 * end], bits, k, hot_keys, hot_splits, parts)
        if lean:
            dest, offsets, data = _rs.pigeonhole_rows(*args)
            dest, offsets = np.frombuffer(dest, dtype="<i4"), np.frombuffer(offsets, dtype="<i4")
            assert len(offsets) == len(dest) + 1 and offsets[-1] == len(data)
            routed = [b""] * parts
            for t, x, y in zip(dest, offsets[:-1], offsets[1:]):
                routed[t] = data[x:y]
        else:
            routed = _rs.pigeonhole_route(*args)
        assert len(routed) == parts
        for t, r in enumerate(routed):
            if r:
                tasks[t].append(r)
    got = []
    for records in tasks:
        rng.shuffle(records)
        if records:
            kept, _, und, over = _rs.pigeonhole_pairs(records, bits, k, lean=lean)
            assert und == b"" and over == []
            got += [tuple(r) for r in np.frombuffer(kept, dtype="<i8").reshape(-1, 3).tolist()]
    want = sorted((min(pos[i], pos[j]), max(pos[i], pos[j]), bin(fps[i] ^ fps[j]).count("1"))
                  for i in range(n) for j in range(i + 1, n) if bin(fps[i] ^ fps[j]).count("1") <= k)
    assert sorted(got) == want


@pytest.mark.parametrize("seed", range(12))
def test_lean_rows_screen_as_the_rows_with_summaries_do(seed):
    """The join's lean rows carry no summaries: each task asks for those of
    its documents (by position, ascending, each once) and screens its pairs
    with them exactly as the rows that carry their documents' summaries
    (kept with their scores, undecided), whatever the tasks and batches."""
    import numpy as np
    import pyarrow as pa

    import neardup
    from neardup import _neardup as _rs

    rng = random.Random(seed)
    words = [f"w{i}" for i in range(300)]
    bases = [[rng.choice(words) for _ in range(rng.randrange(20, 80))] for _ in range(rng.randrange(1, 4))]
    texts = []
    for _ in range(rng.randrange(5, 60)):
        doc = list(rng.choice(bases))
        for _ in range(rng.randrange(0, 6)):
            doc[rng.randrange(len(doc))] = rng.choice(words)
        texts.append(" ".join(doc))
    texts.insert(rng.randrange(len(texts)), texts[0])  # a pair at least
    r = _rs.spark_rows(neardup.FingerprintConfig(bits=128), *neardup._string_buffers(pa.array(texts)), False, "text", "id", summaries=True)
    n, (_, _, size) = len(texts), _rs.PIGEONHOLE_RECORD
    fp, sums = r["fp"], r["summaries"]
    pos = sorted(rng.sample(range(1 << 40), n))
    pos_bytes = np.array(pos, dtype="<i8").tobytes()
    by_pos = {p: sums[i * size:(i + 1) * size] for i, p in enumerate(pos)}
    asked = []

    def summaries_of(need):
        need = np.frombuffer(need, dtype="<i8").tolist()
        asked.append(need)
        return b"".join(by_pos[p] for p in need)

    bits, k, threshold, parts = 128, 19, 0.5, rng.randrange(1, 5)
    none = np.zeros(0, dtype="<i8").tobytes()
    results = []
    for lean in (False, True):
        tasks = [[] for _ in range(parts)]
        for start in range(0, n, 13):
            end = min(n, start + 13)
            args = (fp[16 * start:16 * end], pos_bytes[8 * start:8 * end], bits, k, none, none, parts)
            if lean:
                dest, offsets, data = _rs.pigeonhole_rows(*args)
                offsets = np.frombuffer(offsets, dtype="<i4")
                for t, x, y in zip(np.frombuffer(dest, dtype="<i4"), offsets[:-1], offsets[1:]):
                    tasks[t].append(data[x:y])
            else:
                routed = _rs.pigeonhole_route(*args, sums[size * start:size * end])
                for t, b in enumerate(routed):
                    if b:
                        tasks[t].append(b)
        kept, und = set(), set()
        for records in tasks:
            if not records:
                continue
            asked.clear()
            k_, scores, u, _ = _rs.pigeonhole_pairs(records, bits, k, threshold, lean=lean, summaries_of=summaries_of if lean else None)
            if lean:
                assert len(asked) == 1 and asked[0] == sorted(set(asked[0]))
            kept |= set(zip(map(tuple, np.frombuffer(k_, dtype="<i8").reshape(-1, 3).tolist()), np.frombuffer(scores, dtype="<f8").tolist()))
            und |= set(map(tuple, np.frombuffer(u, dtype="<i8").reshape(-1, 3).tolist()))
        results.append((kept, und))
    assert results[0] == results[1] and results[0][0]
    with pytest.raises(neardup.NeardupError, match="summaries_of"):
        _rs.pigeonhole_pairs([_rs.pigeonhole_rows(fp[:32], pos_bytes[:16], bits, k, none, none, 1)[2]], bits, k, threshold, lean=True)


@pytest.mark.parametrize("seed", range(40))
def test_executors_read_every_line_of_a_range_once(tmp_path, seed):
    """The executors' reader against a plain split of the file: every line
    (blank ones, the last one without a newline, CRLF ones, a first one after
    a byte-order mark) comes from the range holding its first byte, exactly
    once, at its byte offset, whatever the range and read sizes; with
    ``strip`` without its line end; read and cut by core (``large``) the
    same."""
    import pyarrow as pa

    from neardup.spark.read import _POS_SHIFT, read_ranges

    rng = random.Random(seed)
    lines = ["".join(rng.choice("ab {}é\r") for _ in range(rng.randrange(0, 40))) for _ in range(rng.randrange(0, 60))]
    step = rng.randrange(1, 80)
    if step > 40 and rng.random() < 0.5:
        # A line longer than core's first read of a range.
        lines.insert(rng.randrange(len(lines) + 1), "L" * 70_000)
    end = rng.choice(["\n", "\r\n"])
    bom = b"\xef\xbb\xbf" if rng.random() < 0.3 else b""
    raw = bom + (end.join(lines) + (end if rng.random() < 0.5 else "")).encode()
    path = tmp_path / "lines.jsonl"
    path.write_bytes(raw)
    want, at = [], 0
    while at < len(raw):
        stop = raw.find(b"\n", at)
        stop = len(raw) if stop < 0 else stop + 1
        want.append((at, raw[at:stop]))
        at = stop
    if bom:  # not part of the first record, which starts after it
        want[0] = (len(bom), want[0][1][len(bom):])
    ranges = [(str(path), 5, s, min(s + step, len(raw)), True) for s in range(0, len(raw), step)]
    batch = pa.RecordBatch.from_arrays([pa.array([r[i] for r in ranges]) for i in range(5)], names=["path", "rank", "start", "end", "new"])
    for strip, large in ((False, False), (True, False), (False, True)):
        got = [
            (p - (5 << _POS_SHIFT), v.encode())
            for b in read_ranges([batch] if ranges else [], strip, chunk=rng.randrange(1, 100), large=large)
            for v, p in zip(b.column("value").to_pylist(), b.column("_pos").to_pylist())
        ]
        expect = want
        if strip:
            expect = [(o, line[:-1] if line.endswith(b"\n") else line) for o, line in want]
            expect = [(o, line[:-1] if line.endswith(b"\r") else line) for o, line in expect]
        assert got == expect


@pytest.mark.parametrize("seed", range(10))
def test_spilled_feature_sets_are_read_back_by_position(tmp_path, seed):
    """The fingerprint pass's spill: sets, ids and summaries written by
    range (several batches a range, ranges in any order of tasks) are read
    back by position, each its own bytes, whatever positions are asked
    (summaries as bytes too); a position with no set, a summaries file cut
    short, or a folder emptied while the job ran, is a clear error."""
    import numpy as np
    import pyarrow as pa

    import neardup
    from neardup.spark.read import _POS_SHIFT
    from neardup.spark.spill import SUMMARY_BYTES, Spill

    rng = random.Random(seed)
    starts = sorted({(r << _POS_SHIFT) | s for r in range(2) for s in [0] + rng.sample(range(1, 10_000), 3)})
    spill = Spill(str(tmp_path), starts)
    bounds = starts[1:] + [(2 << _POS_SHIFT)]
    want, ids, sums = {}, {}, {}
    order = list(range(len(starts)))
    rng.shuffle(order)
    for i in order:  # one task a range, in any order
        writer = spill.writer()
        span = range(starts[i], min(bounds[i], starts[i] + 5_000))
        pos = sorted(rng.sample(span, min(len(span), rng.randrange(0, 40))))
        for cut in range(0, len(pos), 7):  # batches of one range
            chunk = pos[cut : cut + 7]
            sets = [bytes(rng.randrange(256) for _ in range(4 * rng.randrange(0, 6))) for _ in chunk]
            want.update(zip(chunk, sets))
            names = [rng.choice(['"é-', "", '"\\u00e9']) + str(p) * rng.randrange(0, 3) for p in chunk]
            ids.update(zip(chunk, names))
            summaries = [bytes(rng.randrange(256) for _ in range(SUMMARY_BYTES)) for _ in chunk]
            sums.update(zip(chunk, summaries))
            writer.add(np.array(chunk), b"".join(sets), np.cumsum([len(x) for x in sets]), pa.array(names, pa.string()),
                       b"".join(summaries))
        writer.close()
    asked = sorted(rng.sample(sorted(want), min(len(want), 30)))
    assert spill.sets_at(np.array(asked, dtype=np.int64)) == [want[p] for p in asked]
    assert spill.ids_at(np.array(asked, dtype=np.int64)).to_pylist() == [ids[p] for p in asked]
    assert spill.summaries_at(np.array(asked, dtype="<i8").tobytes()) == b"".join(sums[p] for p in asked)
    # A position with no set, in a range with files.
    def index_of(p):
        return int(np.searchsorted(starts, p, side="right")) - 1

    missing = next(p + 1 for p in sorted(want) if p + 1 not in want and index_of(p + 1) == index_of(p))
    with pytest.raises(neardup.NeardupError, match="no feature set"):
        spill.sets_at(np.array([missing]))
    if asked:
        cut = tmp_path / f"{index_of(asked[-1])}.sums"
        cut.write_bytes(cut.read_bytes()[:-1])
        with pytest.raises(neardup.NeardupError, match="not a summary for each document"):
            spill.summaries_at(np.array(asked[-1:]))
    for f in tmp_path.iterdir():
        f.unlink()
    if asked:
        with pytest.raises(neardup.NeardupError, match="not there"):
            spill.sets_at(np.array(asked[:1]))


@pytest.mark.parametrize("size", [0, 1, (1 << 20) - 1, 1 << 20, (1 << 20) + 1, 3 * (1 << 20) + 517])
def test_large_buffers_are_written_whole_in_pieces(tmp_path, size):
    """write_pieces: what reaches the file is the buffer's bytes, in order,
    whatever its kind (bytes, a memoryview slice, an Arrow buffer, a numpy
    array of wider items), no call handing over more than WRITE_PIECE."""
    import numpy as np
    import pyarrow as pa

    from neardup.spark.files import WRITE_PIECE, write_pieces

    class Recorder(io.BytesIO):
        def __init__(self):
            super().__init__()
            self.calls = []

        def write(self, b):
            self.calls.append(len(memoryview(b).cast("B")))
            return super().write(b)

    assert WRITE_PIECE == 1 << 20  # the sizes above are about it
    rng = np.random.default_rng(size)
    n = size
    raw = rng.integers(0, 256, size=n, dtype=np.uint8).tobytes()
    cut = int(rng.integers(0, n + 1))
    words = np.frombuffer(raw[: n - n % 8], dtype="<u8")
    for data, want in [(raw, raw), (memoryview(raw)[cut:], raw[cut:]), (pa.py_buffer(raw), raw), (words, words.tobytes())]:
        f = Recorder()
        write_pieces(f, data)
        assert f.getvalue() == want
        assert all(0 < c <= WRITE_PIECE for c in f.calls)
        assert len(f.calls) == -(-len(want) // WRITE_PIECE)
    path = tmp_path / "out.bin"
    with open(path, "wb") as f:
        write_pieces(f, raw)
    assert path.read_bytes() == raw

def test_a_spill_folder_that_cannot_be_made_is_refused(spark, tmp_path, capsys):
    """--spill-dir naming a folder that cannot hold one: exit 2, the
    folder named in one line, no output written."""
    from neardup.spark import main

    corpus = make_small(tmp_path / "small.jsonl")
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    out = tmp_path / "out"
    assert main(["dedup", "--input", str(corpus), "--output", str(out), "--format", "jsonl", "-q",
                 "--spill-dir", str(blocked / "below")]) == 2
    err = capsys.readouterr().err
    assert f"{blocked / 'below'}: cannot make a folder there" in err
    assert not out.exists()


def test_only_plain_local_files_skip_the_listing(tmp_path, monkeypatch):
    """Files named one by one are read without Spark's listing, named as it
    names them (absolute paths, file: URLs unwrapped); a folder, a glob, a
    hidden file or another file system is left to the listing."""
    from neardup.spark.read import _local_files

    (tmp_path / "a.jsonl").write_text("{}\n")
    (tmp_path / "_b.jsonl").write_text("{}\n")
    monkeypatch.chdir(tmp_path)
    a = str(tmp_path / "a.jsonl")
    assert _local_files(["a.jsonl", "file://" + a, a]) == [a, a, a]
    assert _local_files([]) == []
    for other in [str(tmp_path), str(tmp_path / "*.jsonl"), "_b.jsonl", "s3://bucket/a.jsonl", "missing.jsonl"]:
        assert _local_files(["a.jsonl", other]) is None


@pytest.mark.parametrize("seed", range(40))
def test_kept_lines_of_ranges_are_each_kept_line_once(tmp_path, seed):
    """Core's copy of a range's kept lines (the local writer of deduped/)
    against a plain reading of the file: over ranges that cut it anywhere,
    every line not removed and not blank, once, in order, without its line
    end and with a newline; a first line after a byte-order mark is named
    by the byte after it; lines longer than the copy's 8 MB reads whole."""
    import numpy as np

    from neardup import _neardup as _rs
    from neardup.spark.read import _POS_SHIFT

    rng = random.Random(seed)
    lines = ["".join(rng.choice("ab {}é\r\t") for _ in range(rng.randrange(0, 30))) for _ in range(rng.randrange(0, 50))]
    if seed == 0:
        lines.insert(1, "x" * (9 << 20))
    raw = (rng.choice(["\n", "\r\n"]).join(lines) + ("\n" if rng.random() < 0.5 else "")).encode()
    bom = rng.random() < 0.3
    raw = (b"\xef\xbb\xbf" if bom else b"") + raw
    path, base = tmp_path / "lines.jsonl", 3 << _POS_SHIFT
    path.write_bytes(raw)
    records, at = [], 0
    while at < len(raw):
        stop = raw.find(b"\n", at)
        stop = len(raw) if stop < 0 else stop + 1
        records.append((3 if bom and at == 0 else at, raw[at:stop][3 if bom and at == 0 else 0 :]))
        at = stop
    gone = [base | o for o, _ in records if rng.random() < 0.3]
    want = b""
    for o, line in records:
        text = line[:-1] if line.endswith(b"\n") else line
        text = text[:-1] if text.endswith(b"\r") else text
        if (base | o) not in gone and text.strip(b" \t\r\n\x0c"):
            want += text + b"\n"
    step = rng.randrange(1, 90) if seed else 1 << 20
    got, rows = b"", 0
    for s in range(0, len(raw), step):
        out = tmp_path / f"part-{s}"
        rows += _rs.write_kept_lines(str(path), s, min(s + step, len(raw)), base, np.array(gone[::-1], dtype="<i8").tobytes(), str(out))
        got += out.read_bytes()
    assert got == want
    assert rows == want.count(b"\n")


def test_line_ends_and_a_byte_order_mark_as_the_cli(spark, tmp_path):
    """A file with a byte-order mark, CRLF line ends, a blank line and no
    final newline, read by the executors and its kept records written by
    them: the CLI's pairs, clusters and kept records."""
    from neardup.spark import main

    lines = open(make_small(tmp_path / "plain.jsonl")).read().splitlines()
    corpus = tmp_path / "crlf.jsonl"
    corpus.write_bytes(b"\xef\xbb\xbf" + ("\r\n".join(lines[:5] + [""] + lines[5:])).encode())
    want = cli_outputs([corpus], tmp_path, [])
    assert len(want[2]) > 10 and len(want[2]) < len(lines)
    out = tmp_path / "out"
    assert main(["dedup", "--input", str(corpus), "--output", str(out), "--format", "jsonl", "-q"]) == 0
    assert spark_outputs(out) == want


def cli_annotated(corpus, tmp_path, flags):
    """`neardup dedup --annotate` beside its pairs, clusters and kept records:
    (the outputs as `cli_outputs` gives them, the annotated file's bytes)."""
    annotated = tmp_path / "cli-annotated.jsonl"
    want = cli_outputs(corpus, tmp_path, ["--annotate", str(annotated), *flags])
    return want, annotated.read_bytes()


def spark_annotated(out):
    return b"".join(f.read_bytes() for f in sorted((out / "annotated").glob("part-*")))


@pytest.mark.parametrize(
    "flags,reader",
    [
        ([], "executors"),
        ([], "spark"),
        (["--no-verify", "--policy", "incremental", "--keep-by", "field:quality:desc"], "executors"),
        (["--against", "OLD", "--no-pairs"], "executors"),
    ],
    ids=["verified", "spark-reader", "unverified-incremental-field", "against-no-pairs"],
)
def test_annotate_equals_cli(spark, tmp_path, monkeypatch, flags, reader):
    """`--annotate` writes annotated/: every record, in input order, with the
    fields `neardup dedup --annotate` adds, byte for byte the CLI's file,
    beside its pairs, clusters and kept records (blank lines, Chinese, ASCII
    escapes and both readers; --no-pairs still verifies every pair, as the
    CLI does with --annotate)."""
    from neardup.spark import LocalSplits, main

    monkeypatch.setattr(LocalSplits, "smallest", 64 << 10)
    if reader == "spark":
        monkeypatch.setenv("NEARDUP_SPARK_READER", "spark")
    corpus = make_mixed(tmp_path / "mixed.jsonl", seed=8, n=1200, ids="int" if "OLD" in flags else "str")
    inputs, flags = [corpus], list(flags)
    if "OLD" in flags:
        lines = corpus.read_text().splitlines(keepends=True)
        old, new = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
        old.write_text("".join(lines[: len(lines) // 2]))
        new.write_text("".join(lines[len(lines) // 2 :]))
        flags[flags.index("OLD")] = str(old)
        inputs = [new]
    cli_flags = [f for f in flags if f != "--no-pairs"]
    want, want_annotated = cli_annotated(inputs, tmp_path, cli_flags)
    records = [json.loads(l) for l in want_annotated.decode().splitlines()]
    assert sum(r["duplicate_of"] is not None for r in records) > 50
    assert sum(r["similarity"] is not None and r["duplicate_of"] is None for r in records) > 20
    out = tmp_path / "out"
    assert main(["dedup", "--input", *map(str, inputs), "--output", str(out), "--format", "jsonl", "-q",
                 "--annotate", *flags]) == 0
    got = spark_outputs(out) if "--no-pairs" not in flags else (want[0], *spark_outputs_no_pairs(out))
    assert got[1] == want[1]
    assert got[2] == want[2]
    assert got[0] == want[0]
    assert spark_annotated(out) == want_annotated


def spark_outputs_no_pairs(out):
    kept = [l for f in sorted((out / "deduped").glob("part-*")) for l in f.read_text().splitlines()]
    return outputs([], read_parts(out / "clusters"), kept)[1:]


def test_annotate_columns_as_the_cli(spark, tmp_path):
    """From PySpark, `annotate=True` on a DataFrame of columns adds the
    columns `cluster`, `duplicate_of` and `similarity` with the values of
    `neardup dedup --annotate`, in input order; Parquet output of JSON Lines
    records has them as columns too."""
    from neardup.spark import dedup, main

    corpus = make_mixed(tmp_path / "mixed.jsonl", seed=9, n=1000)
    _, annotated = cli_annotated([corpus], tmp_path, [])
    want = [json.loads(l) for l in annotated.decode().splitlines()]
    rows = [json.loads(l) for l in corpus.read_text().splitlines() if l.strip()]
    df = spark.createDataFrame([(r["id"], r["text"], r["quality"], i) for i, r in enumerate(rows)],
                               "id string, text string, quality long, row long")
    result = dedup(spark, df, order_col="row", annotate=True)
    got = result.annotated.orderBy("row").collect()
    assert result.annotated.columns == ["id", "text", "quality", "row", "cluster", "duplicate_of", "similarity"]
    assert sum(w["duplicate_of"] is not None for w in want) > 50
    assert [(r.id, r.cluster, r.duplicate_of, None if r.similarity is None else round(r.similarity, 4)) for r in got] == [
        (w["id"], w["cluster"], w["duplicate_of"], w["similarity"]) for w in want
    ]
    out = tmp_path / "out"
    assert main(["dedup", "--input", str(corpus), "--output", str(out), "-q", "--annotate"]) == 0
    table = spark.read.parquet(str(out / "annotated")).collect()
    assert sorted((r.id, r.cluster, r.duplicate_of, r.similarity) for r in table) == sorted(
        (w["id"], w["cluster"], w["duplicate_of"], w["similarity"]) for w in want
    )


def make_features(path, seed=13, n=1500):
    """Weighted features (sparse vectors) with planted near-copies (a few
    weights changed, a feature added or dropped), a numeric field, a blank
    line, a repeated feature name and a record with no features."""
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        f = {f"t{rng.randrange(4000)}": round(rng.random() * 3, 3) for _ in range(rng.randrange(20, 60))}
        docs.append({"id": f"d{i}", "features": f, "q": rng.randrange(50)})
        if i % 4 == 0:
            g = dict(f)
            for _ in range(rng.choice([1, 2, 4, 8])):
                g[rng.choice(list(g))] = round(rng.random() * 3, 3)
            if rng.random() < 0.5:
                g[f"t{rng.randrange(4000)}"] = 0.5
            docs.append({"id": f"c{i}", "features": g, "q": rng.randrange(50)})
    rng.shuffle(docs)
    docs.append({"id": "empty", "features": {}, "q": 1})
    with open(path, "w") as f:
        for x, d in enumerate(docs):
            f.write(json.dumps(d) + "\n")
            if x == 100:
                f.write("\n" + '{"id": "twice", "features": {"t1": 0.5, "t2": 1.5, "t1": 2.0}, "q": 3}\n')
    return path


@pytest.mark.parametrize(
    "flags",
    [
        ["--features-field"],
        ["--features-field", "features", "--bits", "64", "--min-similarity", "0.9", "--policy", "incremental",
         "--keep-by", "field:q:desc"],
        ["--features-field", "--hash", "fnv1a", "--seed", "3", "--k", "14", "--annotate", "ANNOTATED"],
    ],
    ids=["defaults", "64-incremental-field", "hash-seed-k-annotate"],
)
def test_features_equal_cli(spark, tmp_path, flags):
    """`--features-field`: weighted features instead of texts, fingerprinted
    by core as the CLI does (the same defaults: 128 bits, k from the cosine
    threshold 0.95): the CLI's pairs, clusters, kept records and
    annotations."""
    from neardup.spark import main

    corpus = make_features(tmp_path / "f.jsonl")
    flags = list(flags)
    annotate = "ANNOTATED" in flags
    cli_flags = list(flags)
    if annotate:
        flags.remove("ANNOTATED")
        cli_flags[cli_flags.index("--annotate") + 1] = str(tmp_path / "cli-annotated.jsonl")
    want = cli_outputs([corpus], tmp_path, cli_flags)
    assert len(want[0]) > 150 and len(want[1]) > 100
    out = tmp_path / "out"
    assert main(["dedup", "--input", str(corpus), "--output", str(out), "--format", "jsonl", "-q", *flags]) == 0
    got = spark_outputs(out)
    assert got[0] == want[0]
    assert got[1] == want[1]
    assert got[2] == want[2]
    if annotate:
        assert spark_annotated(out) == (tmp_path / "cli-annotated.jsonl").read_bytes()


def test_feature_columns_and_refusals(spark, tmp_path, capsys):
    """Weighted features in a map column, from PySpark (`features_col=`) and
    from Parquet on the command line: the CLI's pairs and clusters; text
    settings and verification are refused with weighted features, as by the
    CLI."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from neardup.spark import dedup, main

    corpus = make_features(tmp_path / "f.jsonl", seed=14, n=800)
    want, annotated = cli_annotated([corpus], tmp_path, ["--features-field"])
    assert len(want[0]) > 80
    rows = [json.loads(l) for l in corpus.read_text().splitlines() if l.strip()]
    df = spark.createDataFrame([(r["id"], r["features"], i) for i, r in enumerate(rows)],
                               "id string, features map<string, double>, row long")
    result = dedup(spark, df, features_col="features", order_col="row")
    got = outputs([r.asDict() for r in result.pairs.collect()], [r.asDict() for r in result.clusters.collect()], [])
    assert got[0] == want[0]
    assert got[1] == want[1]
    assert [r.id for r in result.deduped.orderBy("row").collect()] == [json.loads(l)["id"] for l in want[2]]
    table = pa.Table.from_pylist([{"id": r["id"], "features": list(r["features"].items())} for r in rows],
                                 schema=pa.schema([("id", pa.string()), ("features", pa.map_(pa.string(), pa.float64()))]))
    pq.write_table(table, tmp_path / "f.parquet")
    out = tmp_path / "out"
    assert main(["dedup", "--input", str(tmp_path / "f.parquet"), "--output", str(out), "--format", "jsonl", "-q",
                 "--features-field", "--annotate"]) == 0
    assert outputs(read_parts(out / "pairs"), read_parts(out / "clusters"), [])[:2] == want[:2]
    # Parquet rows annotated: three columns with the CLI's values.
    notes = lambda rows: sorted((r["id"], r["cluster"], r.get("duplicate_of"),  # noqa: E731
                                 None if r.get("similarity") is None else round(r["similarity"], 4)) for r in rows)
    assert notes(read_parts(out / "annotated")) == notes(json.loads(l) for l in annotated.decode().splitlines())
    capsys.readouterr()
    for bad, says in [(["--tokenizer", "words"], "do not apply to weighted features"),
                      (["--verify", "0.8"], "compares texts"), (["--keep-by", "longest"], "lengths"),
                      (["--against", str(corpus)], "--against takes texts")]:
        assert main(["dedup", "--input", str(corpus), "--output", str(out), "-q", "--features-field", *bad]) == 2
        assert says in capsys.readouterr().err
        cli = subprocess.run([neardup_bin(), "dedup", str(corpus), "--features-field", *bad, "--clusters", str(tmp_path / "c.jsonl")],
                             capture_output=True, text=True)
        assert cli.returncode == 2 and says in cli.stderr, cli.stderr


def test_annotate_refuses_a_record_with_the_field(spark, tmp_path, capsys):
    """A record that already has a field --annotate adds stops the job with
    the CLI's message (the same code decides)."""
    from neardup.spark import main

    corpus = make_small(tmp_path / "s.jsonl")
    lines = corpus.read_text().splitlines()
    lines[7] = json.dumps(dict(json.loads(lines[7]), cluster="mine"))
    corpus.write_text("\n".join(lines) + "\n")
    cli = subprocess.run([neardup_bin(), "dedup", str(corpus), "--annotate", str(tmp_path / "a.jsonl")], capture_output=True, text=True)
    assert cli.returncode == 2 and 'already has a field "cluster"' in cli.stderr
    out = tmp_path / "out"
    assert main(["dedup", "--input", str(corpus), "--output", str(out), "--format", "jsonl", "-q", "--annotate"]) == 2
    err = capsys.readouterr().err
    assert 'already has a field "cluster"' in err and "s.jsonl: the line at byte offset" in err and "Traceback" not in err


@pytest.mark.parametrize("ids", ["mixed", "int", "str"])
def test_named_lines_equal_sparks_json_writer(spark, tmp_path, monkeypatch, ids):
    """The distributed path's pairs and clusters as the executors write them
    (named with the ids the fingerprint pass kept) are the lines Spark's
    JSON writer writes from the result's DataFrames (joined with the ids):
    ids with quotes, backslashes, control characters and non-ASCII text,
    integers among strings (then written as strings), in more byte ranges
    and tasks than one."""
    from neardup.spark import LocalSplits, dedup, write
    from neardup.spark.read import read_records

    monkeypatch.setattr(LocalSplits, "smallest", 64 << 10)
    rng = random.Random(11)
    corpus = make_mixed(tmp_path / "mixed.jsonl", seed=7, n=1200, ids="int")
    odd = ['q"uote', "back\\slash", "tab\there", "line\nbreak", "é中文", "emoji 🙂", "ctl\u0001", "/slash"]
    lines = []
    for line in corpus.read_text().splitlines():
        if line.strip():
            d = json.loads(line)
            if ids == "str" or (ids == "mixed" and rng.random() < 0.5):
                d["id"] = f"{rng.choice(odd)}-{d['id']}"
            line = json.dumps(d, ensure_ascii=rng.random() < 0.5)
        lines.append(line)
    corpus.write_text("\n".join(lines) + "\n")
    records, positions, splits = read_records(spark, [str(corpus)], "jsonl", None)
    result = dedup(spark, records, id_col="id", text_col="text", json_col="value", positions=positions, splits=splits,
                   driver_documents=0, max_group=64, quiet=True)
    assert result.write_pairs_local is not None and result.write_clusters_local is not None
    mine, sparks = tmp_path / "mine", tmp_path / "sparks"
    write(result, str(mine), "jsonl")
    result.write_pairs_local = result.write_clusters_local = None
    write(result, str(sparks), "jsonl")
    result.close()
    for name in ("pairs", "clusters"):
        got, want = read_parts(mine / name), read_parts(sparks / name)
        assert len(want) > 50
        assert got == want, name
        if ids == "mixed" and name == "pairs":
            # Integer ids among strings are written as strings.
            assert all(isinstance(p["a"], str) for p in got) and any(p["a"].isdigit() for p in got)


def test_hot_groups_found_in_a_sample(spark, tmp_path, capsys):
    """A group of the distributed join above --max-group (9,000 copies of
    one page, max group 8,192) is found by counting a sample of the
    documents (1 in 2 at this max group), split into block pairs, and the
    clusters and kept records are the CLI's."""
    from neardup.spark import main
    from neardup.spark.candidates import _hot_sample_every

    assert _hot_sample_every(8192) == 2 and _hot_sample_every(64) == 1 and _hot_sample_every(500_000) == 16
    rng = random.Random(5)
    page = " ".join(f"w{rng.randrange(3000)}" for _ in range(120))
    corpus = tmp_path / "hot.jsonl"
    with open(corpus, "w") as f:
        for i in range(12_000):
            text = page if i % 4 else " ".join(f"w{rng.randrange(3000)}" for _ in range(120))
            f.write(json.dumps({"id": i, "text": text}) + "\n")
    clusters, keep = tmp_path / "cli-clusters.jsonl", tmp_path / "cli-keep.jsonl"
    subprocess.run([neardup_bin(), "dedup", str(corpus), "--clusters", str(clusters), "--keep", str(keep), "-q"], check=True)
    want = outputs([], map(json.loads, clusters.read_text().splitlines()), keep.read_text().splitlines())[1:]
    assert max(size for _, size, _ in want[0]) == 9_000
    out = tmp_path / "out"
    assert main(["dedup", "--input", str(corpus), "--output", str(out), "--format", "jsonl", "--no-pairs",
                 "--driver-documents", "0", "--max-group", "8192"]) == 0
    assert "groups of more than 8,192 rows" in capsys.readouterr().err
    assert spark_outputs_no_pairs(out) == want


def test_shared_classes_archive_is_made_once_then_shared(tmp_path, monkeypatch):
    """The local session's archive of classes: the first run asks its JVM to
    write one (under a temporary name, put in place once the JVM has
    ended; nothing when it wrote none), later runs share it, and none is
    used when turned off or when a run's unfinished one is old."""
    import os

    from neardup.spark.cli import _shared_classes

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    option, finish = _shared_classes()
    assert option.startswith("-XX:ArchiveClassesAtExit=") and finish is not None
    written = option.split()[0].split("=", 1)[1]
    assert os.path.dirname(written) == str(tmp_path / "neardup") and written.endswith(".tmp")
    finish()  # the JVM wrote nothing: no archive
    assert not os.listdir(tmp_path / "neardup")
    stale = tmp_path / "neardup" / "spark-classes-0.jsa.1.tmp"
    stale.write_bytes(b"half")
    os.utime(stale, (0, 0))
    option, finish = _shared_classes()
    assert option.startswith("-XX:ArchiveClassesAtExit=") and not stale.exists()
    written = option.split()[0].split("=", 1)[1]
    with open(written, "wb") as f:
        f.write(b"archive")
    finish()
    option, finish = _shared_classes()
    assert finish is None and option.split()[0] == f"-XX:SharedArchiveFile={written.rsplit('.', 2)[0]}"
    monkeypatch.setenv("NEARDUP_SPARK_SHARED_CLASSES", "0")
    assert _shared_classes() == ("", None)


def test_a_master_from_elsewhere_is_kept(tmp_path, monkeypatch):
    """The command line without --master runs locally on every core unless
    Spark has a master from spark-submit, PYSPARK_SUBMIT_ARGS or
    spark-defaults.conf."""
    from neardup.spark.cli import _master_given

    for var in ("PYSPARK_GATEWAY_PORT", "PYSPARK_SUBMIT_ARGS", "SPARK_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    assert not _master_given()
    (tmp_path / "spark-defaults.conf").write_text("# spark.master spark://elsewhere:7077\nspark.driver.memory 2g\n")
    assert not _master_given()
    (tmp_path / "spark-defaults.conf").write_text("spark.master   spark://elsewhere:7077\n")
    assert _master_given()
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path / "none"))
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--master spark://elsewhere:7077 pyspark-shell")
    assert _master_given()
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--driver-memory 2g pyspark-shell")
    assert not _master_given()
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "40000")
    assert _master_given()


def test_task_counts_fill_whole_waves():
    """A stage's task count: at least what it wants and two a core, a
    multiple of the cores, and less than one wave more than needed."""
    from neardup.spark.tasks import task_count

    for cores in (1, 2, 3, 8, 200):
        for wanted in (0, 1, 2, 5, 9, 10, 21, 22, 399, 401, 1000):
            got = task_count(cores, wanted)
            need = max(wanted, 2 * cores)
            assert got % cores == 0 and need <= got < need + cores, (cores, wanted, got)


def test_a_local_session_is_set_for_one_machine(spark):
    """The command line's local session (the fixture's, a new JVM): the
    JVM compiled by C1 alone, its UI off and bound to 127.0.0.1."""
    conf = spark.sparkContext.getConf()
    assert "-XX:TieredStopAtLevel=1" in conf.get("spark.driver.extraJavaOptions", "")
    assert conf.get("spark.ui.enabled") == "false"
    assert conf.get("spark.driver.host") == "127.0.0.1"
