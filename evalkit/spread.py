#!/usr/bin/env python3
"""How far apart unrelated documents' fingerprints lie: the distances of
random pairs of a sample, and how far each bit is from even.

The permuted-table join compares every pair of fingerprints that share a
table's prefix; fingerprints spread like random bits (mean distance f/2, each
bit set in half of the documents) make few such pairs, crowded ones many.

Usage:
  neardup fingerprint --bits 128 CORPUS.jsonl -o FP.jsonl
  evalkit/spread.py FP.jsonl CORPUS.jsonl [--lang en|zh|all] [--docs 7000]

FP.jsonl and CORPUS.jsonl hold the same documents in the same order. A
document is Chinese when its first 2,000 characters hold more than 50 Han
characters; --lang keeps only one kind.
"""

from __future__ import annotations

import argparse
import json
import random
import re

HAN = re.compile(r"[\u4e00-\u9fff]")


def load(fp_path: str, corpus_path: str, docs: int, lang: str) -> list[int]:
    out = []
    with open(fp_path, encoding="utf-8") as fps, open(corpus_path, encoding="utf-8") as corpus:
        for fp_line, doc_line in zip(fps, corpus):
            if not doc_line.strip():
                continue
            text = json.loads(doc_line)["text"]
            chinese = len(HAN.findall(text[:2000])) > 50
            if lang == "all" or (lang == "zh") == chinese:
                out.append(int(json.loads(fp_line)["simhash"], 16))
            if len(out) >= docs:
                break
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("fingerprints")
    ap.add_argument("corpus")
    ap.add_argument("--lang", choices=["en", "zh", "all"], default="all")
    ap.add_argument("--docs", type=int, default=7000, help="documents sampled (the first ones)")
    ap.add_argument("--pairs", type=int, default=400_000, help="random pairs measured")
    ap.add_argument("--bits", type=int, default=128)
    args = ap.parse_args()
    fps = load(args.fingerprints, args.corpus, args.docs, args.lang)
    if len(fps) < 2:
        raise SystemExit("fewer than two documents of that kind")
    rng = random.Random(1)
    dists = []
    for _ in range(args.pairs):
        a, b = rng.randrange(len(fps)), rng.randrange(len(fps))
        if a != b:
            dists.append((fps[a] ^ fps[b]).bit_count())
    n = len(dists)
    mean = sum(dists) / n
    sd = (sum((d - mean) ** 2 for d in dists) / n) ** 0.5
    share = lambda k: sum(d <= k for d in dists) / n  # noqa: E731
    bias = [abs(sum((f >> i) & 1 for f in fps) / len(fps) - 0.5) for i in range(args.bits)]
    print(
        f"{len(fps)} documents, {n} random pairs: distance mean {mean:.1f} (sd {sd:.1f}) "
        f"of {args.bits} bits; within 30: {share(30):.4f}, within 20: {share(20):.5f}, "
        f"within 15: {share(15):.6f}; each bit's share of ones is {sum(bias) / len(bias):.3f} "
        f"from 0.5 on average (at most {max(bias):.3f})"
    )


if __name__ == "__main__":
    main()
