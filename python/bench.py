#!/usr/bin/env python3
"""Benchmarks of the Python package, next to the Rust CLI in the same run.

1. Batch fingerprinting, documents per second on one core:
   neardup.fingerprints(list, threads=1) and over a pyarrow array, against
   `neardup fingerprint --threads 1` on the same texts (its own timer, which
   includes reading and parsing the JSON Lines).
2. The Spark job's wall time on the test corpus (20,300 documents), with the
   time of each stage.

Usage: python python/bench.py [--docs N] [--no-spark] [--neardup target/release/neardup]
"""

import argparse
import json
import os
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


def main():
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
