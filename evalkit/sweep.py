#!/usr/bin/env python3
"""Sweeps fingerprint configurations over the evaluation corpus and writes the
tables and the precision-recall chart of docs/quality.md.

For each language and configuration (tokenizer, features, weights, width f),
the corpus is fingerprinted once and every pair within the largest k is found
once (`neardup dedup --no-verify --k KMAX --pairs`); each smaller k is then the
subset with distance <= k, scored by `neardup eval`. "Verified" scores keep only
the candidates whose exact Jaccard reaches the threshold, which is what
`neardup dedup --verify jaccard:0.8` does.

Usage: evalkit/sweep.py --corpus DIR [--neardup PATH] [--out docs]
DIR holds en/ and zh/, each with corpus.jsonl and truth.jsonl (evalkit/run.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CONFIGS = {
    "en": [
        ("words, tokens, tf", ["--tokenizer", "words", "--features", "tokens", "--weights", "tf"]),
        ("words, tokens, binary", ["--tokenizer", "words", "--features", "tokens", "--weights", "binary"]),
        ("words, tokens, tf-idf", ["--tokenizer", "words", "--features", "tokens", "--weights", "tfidf", "IDF"]),
        ("words, tokens, tf, stop words", ["--tokenizer", "words", "--features", "tokens", "--weights", "tf", "--stopwords"]),
        ("words, tokens, binary, stop words", ["--tokenizer", "words", "--features", "tokens", "--weights", "binary", "--stopwords"]),
        ("words, shingles:2, tf", ["--tokenizer", "words", "--features", "shingles:2", "--weights", "tf"]),
        ("words, shingles:3, tf", ["--tokenizer", "words", "--features", "shingles:3", "--weights", "tf"]),
        ("chars, ngrams:4, tf", ["--tokenizer", "chars", "--features", "ngrams:4", "--weights", "tf"]),
    ],
    "zh": [
        ("jieba, tokens, tf", ["--tokenizer", "jieba", "--features", "tokens", "--weights", "tf"]),
        ("jieba, tokens, binary", ["--tokenizer", "jieba", "--features", "tokens", "--weights", "binary"]),
        ("jieba, tokens, tf-idf", ["--tokenizer", "jieba", "--features", "tokens", "--weights", "tfidf", "IDF"]),
        ("jieba, tokens, tf, stop words", ["--tokenizer", "jieba", "--features", "tokens", "--weights", "tf", "--stopwords"]),
        ("jieba, tokens, binary, stop words", ["--tokenizer", "jieba", "--features", "tokens", "--weights", "binary", "--stopwords"]),
        ("jieba, shingles:2, tf", ["--tokenizer", "jieba", "--features", "shingles:2", "--weights", "tf"]),
        ("jieba, shingles:3, tf", ["--tokenizer", "jieba", "--features", "shingles:3", "--weights", "tf"]),
        ("chars, ngrams:2, tf", ["--tokenizer", "chars", "--features", "ngrams:2", "--weights", "tf"]),
        ("chars, ngrams:3, tf", ["--tokenizer", "chars", "--features", "ngrams:3", "--weights", "tf"]),
    ],
}
WIDTHS = [64, 128]
KMAX = {64: 8, 128: 16}


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"sweep: {' '.join(cmd)} failed:\n{r.stderr}")
    return r.stdout


def evaluate(neardup, found_path, truth_path):
    return json.loads(run([neardup, "eval", "--found", found_path, "--truth", truth_path, "--json"]))


def sweep_language(neardup, lang, corpus_dir, tmp):
    corpus = os.path.join(corpus_dir, lang, "corpus.jsonl")
    truth = os.path.join(corpus_dir, lang, "truth.jsonl")
    jaccard = {}
    with open(truth) as f:
        for line in f:
            t = json.loads(line)
            jaccard[tuple(sorted((json.dumps(t["a"]), json.dumps(t["b"]))))] = t["jaccard"]
    rows = []
    for name, flags in CONFIGS[lang]:
        for bits in WIDTHS:
            flags = list(flags)
            if "IDF" in flags:
                idf = os.path.join(tmp, f"{lang}.idf")
                base = [x for x in flags if x not in ("IDF", "--weights", "tfidf")]
                run([neardup, "idf", "build", corpus, "-o", idf, "-q", *base])
                flags[flags.index("IDF")] = "--idf"
                flags.insert(flags.index("--idf") + 1, idf)
            pairs = os.path.join(tmp, "pairs.jsonl")
            kmax = KMAX[bits]
            run([neardup, "dedup", corpus, "-q", "--no-verify", "--bits", str(bits), "--k", str(kmax), "--pairs", pairs, *flags])
            with open(pairs) as f:
                found = [json.loads(line) for line in f]
            with open(corpus) as f:
                documents = sum(1 for _ in f)
            for k in range(0, kmax + 1):
                subset = [p for p in found if p["distance"] <= k]
                sub = os.path.join(tmp, "sub.jsonl")
                with open(sub, "w") as f:
                    for p in subset:
                        f.write(json.dumps(p) + "\n")
                plain = evaluate(neardup, sub, truth)
                verified_pairs = [
                    p for p in subset
                    if jaccard.get(tuple(sorted((json.dumps(p["a"]), json.dumps(p["b"])))), 0.0) >= 0.8
                ]
                with open(sub, "w") as f:
                    for p in verified_pairs:
                        f.write(json.dumps(p) + "\n")
                verified = evaluate(neardup, sub, truth)
                rows.append({
                    "lang": lang, "config": name, "bits": bits, "k": k, "documents": documents,
                    "candidates": len(subset),
                    "precision": plain["precision"], "recall": plain["recall"], "f1": plain["f1"],
                    "verified_precision": verified["precision"], "verified_recall": verified["recall"],
                    "verified_f1": verified["f1"],
                })
            best = max((r for r in rows if r["config"] == name and r["bits"] == bits), key=lambda r: r["f1"])
            print(f"sweep: {lang} {name} f={bits}: best F1 {best['f1']:.4f} at k={best['k']}", file=sys.stderr)
    return rows


def svg_chart(rows, lang, path):
    """Precision-recall curves (one per configuration, a point per k), no dependencies."""
    w, h, m = 640, 440, 60
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf", "#bcbd22"]
    x = lambda r: m + r * (w - 2 * m)  # noqa: E731
    y = lambda p: h - m - p * (h - 2 * m)  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h + 20 * 8}" font-family="sans-serif" font-size="12">',
           '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{w / 2}" y="20" text-anchor="middle" font-size="14">Precision and recall by k, {"English" if lang == "en" else "Chinese"} (no verification; truth: Jaccard &gt;= 0.8)</text>']
    for t in range(0, 11, 2):
        v = t / 10
        out.append(f'<line x1="{x(0)}" y1="{y(v)}" x2="{x(1)}" y2="{y(v)}" stroke="#ddd"/>')
        out.append(f'<line x1="{x(v)}" y1="{y(0)}" x2="{x(v)}" y2="{y(1)}" stroke="#ddd"/>')
        out.append(f'<text x="{x(v)}" y="{y(0) + 16}" text-anchor="middle">{v:.1f}</text>')
        out.append(f'<text x="{x(0) - 8}" y="{y(v) + 4}" text-anchor="end">{v:.1f}</text>')
    out.append(f'<text x="{w / 2}" y="{h - 20}" text-anchor="middle">recall</text>')
    out.append(f'<text x="18" y="{h / 2}" text-anchor="middle" transform="rotate(-90 18 {h / 2})">precision</text>')
    series = sorted({(r["config"], r["bits"]) for r in rows if r["lang"] == lang})
    series = [s for s in series if s[1] == 64] + [s for s in series if s[1] == 128 and "tokens, tf" in s[0]]
    for i, (name, bits) in enumerate(series):
        pts = [r for r in rows if r["lang"] == lang and r["config"] == name and r["bits"] == bits]
        names = [n for n, _ in series if _ == 64]
        c = colors[names.index(name) % len(colors)] if name in names else colors[i % len(colors)]
        dash = ' stroke-dasharray="5,3"' if bits == 128 else ""
        poly = " ".join(f"{x(r['recall']):.1f},{y(r['precision']):.1f}" for r in pts)
        out.append(f'<polyline points="{poly}" fill="none" stroke="{c}" stroke-width="2"{dash}/>')
        for r in pts:
            out.append(f'<circle cx="{x(r["recall"]):.1f}" cy="{y(r["precision"]):.1f}" r="2.5" fill="{c}"><title>{name} f={bits} k={r["k"]}</title></circle>')
        ly = h + 10 + 20 * (i % 8)
        lx = m + (i // 8) * 300
        out.append(f'<line x1="{lx}" y1="{ly}" x2="{lx + 24}" y2="{ly}" stroke="{c}" stroke-width="2"{dash}/>')
        out.append(f'<text x="{lx + 30}" y="{ly + 4}">{name}, f = {bits}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def table(rows, lang):
    """Per configuration: the best F1 without verification, and the smallest k at
    which verification reaches recall 0.97, with the candidates it then checks."""
    docs = max(r["documents"] for r in rows if r["lang"] == lang)
    lines = [
        "| configuration | f | plain: best k | precision | recall | F1 "
        "| verified: k for recall >= 0.97 | F1 | candidates per document |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in [c[0] for c in CONFIGS[lang]]:
        for bits in WIDTHS:
            mine = [r for r in rows if r["lang"] == lang and r["config"] == name and r["bits"] == bits]
            if not mine:
                continue
            best = max(mine, key=lambda r: (r["f1"], -r["k"]))
            ok = [r for r in mine if r["verified_recall"] >= 0.97]
            if ok:
                v = ok[0]
                ver = f"{v['k']} | {v['verified_f1']:.3f} | {v['candidates'] / docs:.2f}"
            else:
                top = mine[-1]
                ver = f"not reached (recall {top['verified_recall']:.3f} at k = {top['k']}) | {top['verified_f1']:.3f} | {top['candidates'] / docs:.2f}"
            lines.append(
                f"| {name} | {bits} | {best['k']} | {best['precision']:.3f} | {best['recall']:.3f} | {best['f1']:.3f} | {ver} |"
            )
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--neardup", default="target/release/neardup")
    ap.add_argument("--out", default="docs")
    ap.add_argument("--lang", choices=["en", "zh", "all"], default="all")
    args = ap.parse_args()
    langs = ["en", "zh"] if args.lang == "all" else [args.lang]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for lang in langs:
            rows += sweep_language(args.neardup, lang, args.corpus, tmp)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "quality-sweep.json"), "w") as f:
        json.dump(rows, f, indent=1)
    for lang in langs:
        svg_chart(rows, lang, os.path.join(args.out, f"quality-pr-{lang}.svg"))
        with open(os.path.join(args.out, f"quality-table-{lang}.md"), "w") as f:
            f.write(table(rows, lang) + "\n")
        print(f"\n### {lang}\n\n{table(rows, lang)}")


if __name__ == "__main__":
    main()
