#!/usr/bin/env bash
# Rebuilds the evaluation corpus, its exact ground truth, and the figures of
# docs/quality.md.
#
#   evalkit/run.sh            full corpus in target/evalkit, sweep, docs/quality-*
#   evalkit/run.sh --sample   the small sample kept in git, evalkit/data
#
# Needs the Rust toolchain's documentation (rustup component add rust-docs) and
# Debian's Chinese manuals; on Debian or Ubuntu it installs the latter itself.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs="debian-reference-zh-cn debian-edu-doc-zh-cn debian-faq-zh-cn maint-guide-zh-cn"
if ! dpkg -s $pkgs >/dev/null 2>&1; then
  if command -v apt-get >/dev/null; then
    sudo_cmd=""; [ "$(id -u)" = 0 ] || sudo_cmd="sudo"
    $sudo_cmd apt-get update -q && DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q $pkgs
  else
    echo "evalkit: install the Debian packages $pkgs (or their text) first" >&2; exit 1
  fi
fi
if ! ls "$(rustc --print sysroot)/share/doc/rust/html/book" >/dev/null 2>&1; then
  rustup component add rust-docs
fi

cargo build --release -q
nd=target/release/neardup

if [ "${1:-}" = "--sample" ]; then
  out=evalkit/data; bases=250
else
  out=target/evalkit; bases=100000
fi
python3 evalkit/build_corpus.py --out "$out" --bases "$bases"
for lang in en zh; do
  $nd truth -q "$out/$lang/corpus.jsonl" --edits "$out/$lang/edits.jsonl" -o "$out/$lang/truth.jsonl"
  echo "== $lang: neardup dedup (defaults) =="
  $nd dedup "$out/$lang/corpus.jsonl" --pairs "$out/$lang/found.jsonl"
  $nd eval --found "$out/$lang/found.jsonl" --truth "$out/$lang/truth.jsonl"
  rm -f "$out/$lang/found.jsonl"
  echo "== $lang: neardup serve (a collection with no flags), insert_if_new through HTTP =="
  python3 evalkit/service.py --neardup "$nd" --corpus "$out/$lang/corpus.jsonl" --truth "$out/$lang/truth.jsonl"
done
if [ "${1:-}" != "--sample" ]; then
  python3 evalkit/sweep.py --corpus "$out" --neardup "$nd" --out docs
fi
