#!/usr/bin/env python3
"""Scores `neardup serve` as a crawler uses it: every document of a corpus is
sent in order with `insert_if_new`; a document is refused when the service
finds a near-duplicate already stored. The exact truth is the same run done
exactly: in corpus order, a document is a duplicate when a document stored
before it (not refused itself) has Jaccard similarity at least --threshold with
it, by `neardup truth`'s features (the truth file lists every pair at 0.5 or
more). Precision: the refused documents that are duplicates; recall: the
duplicates refused.

    python3 evalkit/service.py --corpus C.jsonl --truth T.jsonl [--neardup BIN]
        [-- SERVE FLAGS...]

The service runs on 127.0.0.1 in a temporary folder and is stopped by its
process id at the end. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def run(neardup: str, corpus: list, serve_flags: list, batch: int) -> tuple[set, float]:
    """The ids refused, and the documents per second."""
    port = free_port()
    with tempfile.TemporaryDirectory() as data:
        proc = subprocess.Popen(
            [neardup, "serve", "--data", data, "--addr", f"127.0.0.1:{port}", *serve_flags],
            stderr=subprocess.DEVNULL,
        )
        try:
            for _ in range(200):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
                    break
                except OSError:
                    time.sleep(0.05)
            else:
                sys.exit("service.py: the service did not start")
            refused = set()
            started = time.time()
            for i in range(0, len(corpus), batch):
                docs = [{"id": d["id"], "text": d["text"]} for d in corpus[i : i + batch]]
                r = post(f"http://127.0.0.1:{port}/v1/documents", {"documents": docs, "mode": "insert_if_new"})
                refused |= {x["id"] for x in r["results"] if not x["stored"]}
            rate = len(corpus) / (time.time() - started)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    return refused, rate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--truth", required=True)
    ap.add_argument("--neardup", default=os.environ.get("NEARDUP_BIN", "target/release/neardup"))
    ap.add_argument("--threshold", type=float, default=0.8)
    ap.add_argument("--batch", type=int, default=100, help="documents per request")
    ap.add_argument("--json", action="store_true", help="print the scores as one JSON object")
    ap.add_argument("serve", nargs="*", help="flags for neardup serve (after --)")
    args = ap.parse_args()
    with open(args.corpus, encoding="utf-8") as f:
        corpus = [json.loads(line) for line in f if line.strip()]
    # The exact run: in corpus order, a document is refused when one already
    # stored has Jaccard similarity at least the threshold with it.
    near: dict = {}
    with open(args.truth, encoding="utf-8") as f:
        for line in f:
            t = json.loads(line)
            if t.get("jaccard", 0) >= args.threshold:
                a, b = str(t["a"]), str(t["b"])
                near.setdefault(a, set()).add(b)
                near.setdefault(b, set()).add(a)
    stored: set = set()
    duplicate = set()
    for d in corpus:
        i = str(d["id"])
        if near.get(i, set()) & stored:
            duplicate.add(i)
        else:
            stored.add(i)
    refused, rate = run(args.neardup, corpus, args.serve, args.batch)
    refused = {str(x) for x in refused}
    tp = len(refused & duplicate)
    precision = tp / len(refused) if refused else 1.0
    recall = tp / len(duplicate) if duplicate else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    scores = {
        "documents": len(corpus),
        "duplicates": len(duplicate),
        "refused": len(refused),
        "precision": round(precision, 4),
        "recall": round(recall, 4),
        "f1": round(f1, 4),
        "documents_per_second": round(rate),
        "serve_flags": args.serve,
    }
    if args.json:
        print(json.dumps(scores))
    else:
        print(
            f"service ({' '.join(args.serve) or 'defaults'}): {len(corpus)} documents, {len(duplicate)} duplicates, "
            f"{len(refused)} refused; precision {precision:.4f}  recall {recall:.4f}  F1 {f1:.4f}  "
            f"({rate:.0f} documents/s through HTTP, batches of {args.batch})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
