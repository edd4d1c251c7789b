#!/usr/bin/env python3
"""Benchmarks of the Python package, next to the Rust CLI in the same run.

1. Batch fingerprinting, documents per second on one core:
   neardup.fingerprints(list, threads=1) and over a pyarrow array, against
   `neardup fingerprint --threads 1` on the same texts (its own timer, which
   includes reading and parsing the JSON Lines).
2. The Spark job's wall time on the test corpus (20,300 documents), with the
   time of each stage.

`python python/bench.py spark --gb 1`: the Spark job (`local[2]`, driver
memory 4g) against `neardup dedup` on one generated corpus of real English
and Chinese text with planted near-duplicates (`neardup bench dedup`'s), both
writing pairs, clusters and kept records: wall time, peak resident memory of
the largest process, their ratio, and whether the kept records agree.

Usage: python python/bench.py [--docs N] [--no-spark] [--neardup target/release/neardup]
       python python/bench.py spark [--gb 1] [--corpus FILE] [--no-pairs] [--near-copies N] [--exact-copies N] [--neardup ...]
"""

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The installed package, not the source folder beside this script.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT / "python" / "tests"))


def corpus_texts(n):
    """Real English text: the evaluation kit's sample, repeated to n documents."""
    docs = [json.loads(l) for l in (ROOT / "evalkit/data/en/corpus.jsonl").read_text().splitlines()]
    texts = [d["text"] for d in docs]
    return [texts[i % len(texts)] + f" ({i})" for i in range(n)]


def best_of(f, runs=3):
    best = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t)
    return best


def timed(cmd):
    """Wall time, peak RSS (MB) of the largest process of the tree, stderr."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    if status != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{err}")
    return wall, usage.ru_maxrss / 1024, err


def plant_copies(corpus, out, near, exact, seed=7):
    """``corpus`` with ``near`` near copies and ``exact`` exact copies of
    its first record of 3,000-8,000 characters appended (the skew case):
    a near copy has one to four of the page's words replaced at random, as
    a counter, a date or a session id changes."""
    rng = random.Random(seed)
    page = None
    with open(corpus, "rb") as f, open(out, "wb") as w:
        for line in f:
            w.write(line)
            if page is None:
                r = json.loads(line)
                if 3000 <= len(r.get("text", "")) <= 8000 and " " in r["text"]:
                    page = r
        if page is None:
            sys.exit(f"{corpus}: no record of 3,000-8,000 characters to copy")
        words = page["text"].split(" ")
        for i in range(near):
            copy = list(words)
            for _ in range(rng.randint(1, 4)):
                copy[rng.randrange(len(copy))] = f"x{rng.randrange(10**9)}"
            w.write(json.dumps(dict(page, id=f"near-{i}", text=" ".join(copy)), ensure_ascii=False).encode() + b"\n")
        for i in range(exact):
            w.write(json.dumps(dict(page, id=f"exact-{i}"), ensure_ascii=False).encode() + b"\n")
    print(f"planted {near:,} near and {exact:,} exact copies of {page['id']!r} ({len(page['text']):,} characters)")
    return out


def spark_bench(argv):
    ap = argparse.ArgumentParser(prog="bench.py spark")
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--corpus", help="a JSON Lines corpus instead of a generated one")
    ap.add_argument("--neardup", default=str(ROOT / "target/release/neardup"))
    ap.add_argument("--tmp-dir", default=None)
    ap.add_argument("--no-pairs", action="store_true",
                    help="clusters and kept records only: the CLI without --pairs, the job with --no-pairs")
    ap.add_argument("--driver-documents", type=int, help="the job's --driver-documents (N: the driver joins up to N documents)")
    ap.add_argument("--driver-memory", help="the job's driver memory (default: Spark's)")
    ap.add_argument("--report", help="the job's --report FILE (its stages' seconds, rows, shuffles and longest tasks)")
    ap.add_argument("--near-copies", type=int, default=0,
                    help="append this many near copies of one page (one to four words replaced in each): skew")
    ap.add_argument("--exact-copies", type=int, default=0, help="append this many exact copies of the same page")
    args = ap.parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    with tempfile.TemporaryDirectory(dir=args.tmp_dir) as tmp:
        tmp = Path(tmp)
        corpus = Path(args.corpus) if args.corpus else tmp / "corpus.jsonl"
        if not args.corpus:
            r = subprocess.run([args.neardup, "bench", "dedup", "--gb", str(args.gb), "--save-corpus", str(corpus), "--generate-only"],
                               capture_output=True, text=True, check=True)
            print(r.stdout.strip())
        if args.near_copies or args.exact_copies:
            corpus = plant_copies(corpus, tmp / "skewed.jsonl", args.near_copies, args.exact_copies)
        mb = corpus.stat().st_size / 1e6
        cli_out = tmp / "cli"
        cli_out.mkdir()
        pairs = [] if args.no_pairs else ["--pairs", str(cli_out / "pairs.jsonl")]
        cli = [args.neardup, "dedup", str(corpus), *pairs, "--clusters", str(cli_out / "clusters.jsonl"),
               "--keep", str(cli_out / "keep.jsonl")]
        t_cli, m_cli, err = timed(cli)
        print(f"neardup dedup (CLI, all cores)      {t_cli:7.1f} s  {mb / t_cli:6.1f} MB/s  peak {m_cli:6.0f} MB")
        spark_out = tmp / "spark"
        job = [sys.executable, "-m", "neardup.spark", "dedup", "--input", str(corpus), "--output", str(spark_out), "--format", "jsonl",
               "--master", "local[2]", *(["--driver-memory", args.driver_memory] if args.driver_memory else []),
               *(["--no-pairs"] if args.no_pairs else []), *(["--report", args.report] if args.report else []),
               *(["--driver-documents", str(args.driver_documents)] if args.driver_documents is not None else [])]
        t_spark, m_spark, err = timed(job)
        memory = f", driver {args.driver_memory}" if args.driver_memory else ""
        print(f"Spark job (local[2]{memory})     {t_spark:7.1f} s  {mb / t_spark:6.1f} MB/s  peak {m_spark:6.0f} MB (largest process)")
        stages = re.search(r"done in .*", err)
        print(f"  {stages.group(0) if stages else err.strip()}")
        kept_cli = (cli_out / "keep.jsonl").read_text().splitlines()
        kept_spark = [l for f in sorted((spark_out / "deduped").glob("part-*")) for l in f.read_text().splitlines()]
        same = sorted(kept_cli) == sorted(kept_spark)
        print(f"Spark / CLI wall time: {t_spark / t_cli:.2f}x; kept records: {len(kept_spark)} (Spark), {len(kept_cli)} (CLI), "
              f"{'identical' if same else 'DIFFERENT'}")
        if not same:
            sys.exit(1)


def main():
    if sys.argv[1:2] == ["spark"]:
        return spark_bench(sys.argv[2:])
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=20000)
    ap.add_argument("--no-spark", action="store_true")
    ap.add_argument("--neardup", default=str(ROOT / "target/release/neardup"))
    args = ap.parse_args()
    import neardup

    texts = corpus_texts(args.docs)
    mb = sum(len(t.encode()) for t in texts) / 1e6
    print(f"fingerprinting {len(texts)} documents ({mb:.1f} MB of English), one core, best of 3:")
    t_list = best_of(lambda: neardup.fingerprints(texts, threads=1))
    print(f"  neardup.fingerprints(list, threads=1)   {len(texts) / t_list:10.0f} docs/s  {mb / t_list:6.1f} MB/s")
    try:
        import pyarrow as pa

        arr = pa.array(texts)
        t_arrow = best_of(lambda: neardup.fingerprints(arr, threads=1))
        print(f"  neardup.fingerprints(pyarrow, threads=1) {len(texts) / t_arrow:9.0f} docs/s  {mb / t_arrow:6.1f} MB/s")
    except ImportError:
        pass
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.jsonl"
        path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))

        def cli():
            subprocess.run([args.neardup, "fingerprint", str(path), "--threads", "1", "-o", str(Path(tmp) / "o.jsonl"), "-q"], check=True)

        t_cli = best_of(cli)
        print(f"  neardup fingerprint --threads 1 (CLI)    {len(texts) / t_cli:9.0f} docs/s  {mb / t_cli:6.1f} MB/s")
        print(f"  Python list / CLI: {t_cli / t_list:.2f}x the CLI's rate")
        if args.no_spark:
            return
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        from test_spark import make_corpus

        corpus = Path(tmp) / "spark.jsonl"
        n = make_corpus(corpus)
        out = Path(tmp) / "out"
        t = time.perf_counter()
        r = subprocess.run(
            [sys.executable, "-m", "neardup.spark", "dedup", "--input", str(corpus), "--output", str(out), "--master", "local[2]"],
            capture_output=True, text=True,
        )
        wall = time.perf_counter() - t
        if r.returncode != 0:
            sys.exit(r.stderr)
        stages = re.search(r"done in .*", r.stderr)
        print(f"\nSpark job, local[2], {n} documents: {wall:.1f} s wall (with JVM start-up)")
        print(f"  {stages.group(0) if stages else r.stderr.strip()}")
        t = time.perf_counter()
        subprocess.run([args.neardup, "dedup", str(corpus), "--pairs", str(Path(tmp) / "p.jsonl"), "-q"], check=True)
        print(f"  neardup dedup (CLI, 2 threads) on the same input: {time.perf_counter() - t:.2f} s")


if __name__ == "__main__":
    main()
