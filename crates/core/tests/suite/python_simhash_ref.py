#!/usr/bin/env python3
"""Independent reference for neardup's `python-simhash` profile.

Reimplements, with the standard library only, what PyPI `simhash` (Simhash(...),
default settings) computes, and, when that library is installed, also asks it.

Reads JSON Lines on stdin, one case each: {"text": str} | {"features": [str]} |
{"weighted": [[str, number], ...]}. Writes one JSON line per case:
{"reference": "<16 hex>", "library": "<16 hex>" or null}.
"""
import hashlib
import json
import re
import sys

try:
    from simhash import Simhash  # the real library, if installed
except ImportError:  # pragma: no cover
    Simhash = None

WORD = re.compile(r"[\w\u4e00-\u9fcc]+")
WIDTH = 4
F = 64


def features(text):
    s = "".join(WORD.findall(text.lower()))
    return [s[i:i + WIDTH] for i in range(max(len(s) - WIDTH + 1, 1))]


def feature_hash(feature):
    return int.from_bytes(hashlib.md5(feature.encode("utf-8")).digest()[-8:], "big")


def from_weighted(pairs):
    total = 0
    sums = [0] * F
    for feature, weight in pairs:
        total += weight
        h = feature_hash(feature)
        for j in range(F):
            if (h >> j) & 1:
                sums[j] += weight
    return sum(1 << j for j in range(F) if sums[j] > total / 2)


def from_text(text):
    counts = {}
    for f in features(text):
        counts[f] = counts.get(f, 0) + 1
    return from_weighted(counts.items())


def main():
    for line in sys.stdin:
        case = json.loads(line)
        if "text" in case:
            ref = from_text(case["text"])
            lib = Simhash(case["text"]).value if Simhash else None
        elif "features" in case:
            ref = from_weighted((f, 1) for f in case["features"])
            lib = Simhash(case["features"]).value if Simhash else None
        else:
            pairs = [(f, w) for f, w in case["weighted"]]
            ref = from_weighted(pairs)
            lib = Simhash(pairs).value if Simhash else None
        out = {"reference": "%016x" % ref, "library": None if lib is None else "%016x" % lib}
        sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
