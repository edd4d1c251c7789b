#!/usr/bin/env python3
"""Builds neardup's labelled evaluation corpus from real, human-written text.

Base documents are sections of documentation available offline:

  en  The Rust Programming Language, The Rust Reference, The Rustonomicon, Rust
      by Example, The rustc and rustdoc books and the Edition
      Guide (all MIT OR Apache-2.0), shipped with the Rust toolchain (rustup
      component rust-docs) under `$(rustc --print sysroot)/share/doc/rust/html/`.
  zh  Debian Reference, Simplified Chinese (GPL-2+, Debian package
      debian-reference-zh-cn) and the Debian Edu manuals in Simplified Chinese
      (GPL-2+, debian-edu-doc-zh-cn): `apt-get install debian-reference-zh-cn
      debian-edu-doc-zh-cn`.

Near-duplicates are made from base documents the way real ones arise on the web
(Manku et al. 2007, section 4): small word edits, an inserted advertisement or
navigation block, changed timestamps and counters, re-wrapped lines, reordered
paragraphs, truncation, and combinations of these; Chinese documents are also
re-typeset (wrapped at a fixed width inside Latin words and joined again
without a space; punctuation of the other width and CRLF line ends) and cut at
their beginning. Hard negatives are pairs that
look alike without being near-duplicates: neighbouring sections of one manual
(same vocabulary, same style), two different documents inside one large page
template, and over-edited copies whose similarity falls below the threshold.

Output, per language, in OUT/LANG/:
  corpus.jsonl  {"id", "text"} per document, bases and variants shuffled
  edits.jsonl   {"a", "b", "edit"}: each made pair and how it was made

The exact ground truth (every pair with Jaccard >= 0.5 of the documents'
verification features, computed without sampling) is then made by
`neardup truth OUT/LANG/corpus.jsonl --edits OUT/LANG/edits.jsonl -o truth.jsonl`;
`evalkit/run.sh` does all of it. Deterministic: the same sources and seed give
the same corpus, byte for byte.
"""

from __future__ import annotations

import argparse
import glob
import html.parser
import json
import os
import random
import re
import subprocess
import sys

BLOCK = {"p", "li", "dd", "dt", "blockquote", "h1", "h2", "h3", "h4", "h5", "td", "th"}
SKIP = {"pre", "script", "style", "nav", "head", "title"}
HEADING = {"h1", "h2", "h3"}


class Sections(html.parser.HTMLParser):
    """Splits a page into sections at h1-h3, each a list of paragraphs."""

    def __init__(self, main_only: bool):
        super().__init__(convert_charrefs=True)
        self.main_only = main_only
        self.in_main = not main_only
        self.skip = 0
        self.depth_block = 0
        self.buf: list[str] = []
        self.sections: list[list[str]] = [[]]
        self.nav_div = 0

    def handle_starttag(self, tag, attrs):
        cls = dict(attrs).get("class") or ""
        if tag == "main":
            self.in_main = True
        if tag == "div" and ("navheader" in cls or "navfooter" in cls or "toc" in cls):
            self.nav_div += 1
        elif tag == "div" and self.nav_div:
            self.nav_div += 1
        if tag in SKIP:
            self.skip += 1
        if tag in HEADING:
            self.flush()
            if self.sections[-1]:
                self.sections.append([])
        if tag in BLOCK:
            self.flush()
            self.depth_block += 1

    def handle_endtag(self, tag):
        if tag == "main" and self.main_only:
            self.flush()
            self.in_main = False
        if tag == "div" and self.nav_div:
            self.nav_div -= 1
        if tag in SKIP and self.skip:
            self.skip -= 1
        if tag in BLOCK:
            self.flush()
            self.depth_block = max(0, self.depth_block - 1)

    def handle_data(self, data):
        if self.in_main and not self.skip and not self.nav_div and self.depth_block:
            self.buf.append(data)

    def flush(self):
        text = re.sub(r"\s+", " ", "".join(self.buf)).strip()
        self.buf = []
        if text:
            self.sections[-1].append(text)


def size(text: str, lang: str) -> int:
    """Words for English, Han characters for Chinese."""
    if lang == "zh":
        return sum(1 for c in text if "\u4e00" <= c <= "\u9fff")
    return len(text.split())


def sections_of(paths: list[str], main_only: bool, lang: str, source: str):
    """Yields (source, paragraphs) for each section long enough to be a page."""
    lo, hi = (80, 1200) if lang == "en" else (150, 1000)
    for path in sorted(paths):
        with open(path, encoding="utf-8", errors="replace") as f:
            parser = Sections(main_only)
            parser.feed(f.read())
            parser.flush()
        pending: list[str] = []
        for sec in parser.sections:
            pending += sec
            n = sum(size(p, lang) for p in pending)
            if n < lo:
                continue
            # Long sections become several pages of at most `hi`.
            page: list[str] = []
            for p in pending:
                page.append(p)
                if sum(size(q, lang) for q in page) >= hi:
                    yield f"{source}:{os.path.basename(path)}", page
                    page = []
            if page and sum(size(q, lang) for q in page) >= lo:
                yield f"{source}:{os.path.basename(path)}", page
            pending = []


def rust_docs() -> str:
    sysroot = subprocess.run(
        ["rustc", "--print", "sysroot"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return os.path.join(sysroot, "share", "doc", "rust", "html")


ENGLISH_BOOKS = ["book", "reference", "nomicon", "rust-by-example", "rustc", "rustdoc", "edition-guide"]


def english_bases():
    root = rust_docs()
    if not glob.glob(os.path.join(root, "book", "ch*.html")):
        sys.exit(
            f"build_corpus: no Rust Book under {root}/book: install it with "
            "`rustup component add rust-docs`"
        )
    for name in ENGLISH_BOOKS:
        # print.html repeats a whole book on one page; toc and 404 are not prose.
        pages = [
            p
            for p in glob.glob(os.path.join(root, name, "**", "*.html"), recursive=True)
            if os.path.basename(p) not in ("print.html", "toc.html", "404.html", "index.html")
        ]
        yield from sections_of(pages, True, "en", f"rust-{name}")


def chinese_bases():
    ref = glob.glob("/usr/share/debian-reference/*.zh-cn.html")
    edu = glob.glob("/usr/share/doc/debian-edu-doc-zh-cn/*manual*.html")
    if not ref:
        sys.exit(
            "build_corpus: no Debian Reference in Chinese under /usr/share/debian-reference: "
            "install it with `apt-get install debian-reference-zh-cn debian-edu-doc-zh-cn debian-faq-zh-cn maint-guide-zh-cn`"
        )
    yield from sections_of(ref, False, "zh", "debian-reference-zh-cn")
    yield from sections_of(edu, False, "zh", "debian-edu-doc-zh-cn")
    faq = glob.glob("/usr/share/doc/debian/FAQ/zh-cn/*.zh-cn.html")
    yield from sections_of(faq, False, "zh", "debian-faq-zh-cn")
    maint = glob.glob("/usr/share/doc/maint-guide-zh-cn/html/*.zh-cn.html")
    yield from sections_of(maint, False, "zh", "maint-guide-zh-cn")


# --- the edits -------------------------------------------------------------

EN_FILLER = (
    "the a new very also just really quite simply often usually data system value "
    "program example result many some each user page code file time way"
).split()
ZH_FILLER = list("的了是在和有也就都而及与或被把这那个们中上下来去对说要会能")

EN_BOILER = [
    "Home | Products | Documentation | Blog | Pricing | Contact us | Sign in",
    "Sponsored: Try CloudHost Pro free for 30 days. Fast servers, friendly support, no credit card required. Learn more",
    "Share this article: Twitter Facebook LinkedIn Email Print",
    "Related posts: Ten tips for faster builds; Why we moved to async; A tour of our new dashboard",
    "Subscribe to our newsletter and get the latest articles delivered to your inbox every week.",
    "Copyright 2024 Example Media Group. All rights reserved. Privacy policy | Terms of service | Cookie settings",
    "Advertisement: Learn to code in 12 weeks with our online bootcamp. Enroll today and save 20 percent.",
]
ZH_BOILER = [
    "首页 | 产品 | 文档 | 博客 | 价格 | 联系我们 | 登录",
    "广告：云主机专业版免费试用三十天，高速服务器，贴心客服，无需信用卡。了解更多",
    "分享到：微博 微信 QQ空间 豆瓣 打印本页",
    "相关文章：提高构建速度的十个技巧；我们为什么转向异步；新版控制台导览",
    "订阅我们的电子报，每周将最新文章发送到您的邮箱。",
    "版权所有 2024 示例传媒集团。保留所有权利。隐私政策 | 服务条款 | Cookie 设置",
    "推广：十二周在线编程训练营，立即报名立减百分之二十。",
]


def words_of(par: str, lang: str) -> list[str]:
    return list(par) if lang == "zh" else par.split(" ")


def join_words(ws: list[str], lang: str) -> str:
    return "".join(ws) if lang == "zh" else " ".join(ws)


def word_edits(pars, lang, rng, rate):
    filler = ZH_FILLER if lang == "zh" else EN_FILLER
    out = []
    for par in pars:
        ws = words_of(par, lang)
        new = []
        for w in ws:
            r = rng.random()
            if r < rate / 3:
                continue  # delete
            if r < 2 * rate / 3:
                new.append(rng.choice(filler))  # substitute
            else:
                new.append(w)
            if rng.random() < rate / 3:
                new.append(rng.choice(filler))  # insert
        out.append(join_words(new, lang))
    return out


def boilerplate(pars, lang, rng, blocks):
    pool = ZH_BOILER if lang == "zh" else EN_BOILER
    out = list(pars)
    for _ in range(blocks):
        block = rng.choice(pool)
        where = rng.choice(["top", "bottom", "middle"])
        if where == "top":
            out.insert(0, block)
        elif where == "bottom":
            out.append(block)
        else:
            out.insert(rng.randrange(len(out) + 1), block)
    return out


def stamp(rng, lang):
    y, m, d = rng.randrange(2015, 2026), rng.randrange(1, 13), rng.randrange(1, 29)
    hh, mm = rng.randrange(24), rng.randrange(60)
    views = rng.randrange(10, 100000)
    if lang == "zh":
        return f"发布于 {y}年{m}月{d}日 {hh:02}:{mm:02} · 阅读 {views} 次 · 评论 {rng.randrange(500)} 条"
    return f"Posted {y}-{m:02}-{d:02} {hh:02}:{mm:02} · {views:,} views · {rng.randrange(500)} comments"


def timestamps(pars, lang, rng):
    """Every number changes (counters, dates); the stamp line is replaced."""
    out = [re.sub(r"\d+", lambda _: str(rng.randrange(1, 10000)), p) for p in pars]
    if out and (out[0].startswith("Posted ") or out[0].startswith("发布于")):
        out[0] = stamp(rng, lang)
    else:
        out.insert(0, stamp(rng, lang))
    return out


def rewrap(pars, lang, rng):
    """Hard-wrapped lines at another width: a different text, the same words."""
    width = rng.randrange(28, 40) if lang == "zh" else rng.randrange(50, 80)
    out = []
    for p in pars:
        if lang == "zh":
            lines = [p[i : i + width] for i in range(0, len(p), width)]
        else:
            lines, cur = [], ""
            for w in p.split(" "):
                if cur and len(cur) + 1 + len(w) > width:
                    lines.append(cur)
                    cur = w
                else:
                    cur = f"{cur} {w}" if cur else w
            lines.append(cur)
        out.append("\n".join(lines))
    return out


def reorder(pars, rng):
    out = list(pars)
    if len(out) < 2:
        return out
    if rng.random() < 0.5:
        i, j = rng.sample(range(len(out)), 2)
        out[i], out[j] = out[j], out[i]
    else:
        rng.shuffle(out)
    return out


def truncate(pars, lang, rng, keep):
    text = "\n\n".join(pars)
    cut = int(len(text) * keep)
    if lang == "en":
        sp = text.rfind(" ", 0, cut)
        cut = sp if sp > 0 else cut
    return text[:cut].split("\n\n")


def truncate_tail(pars, lang, rng, keep):
    """The last `keep` of the text: a page whose beginning was cut."""
    text = "\n\n".join(pars)
    cut = len(text) - int(len(text) * keep)
    if lang == "en":
        sp = text.find(" ", cut)
        cut = sp + 1 if sp >= 0 else cut
    return text[cut:].split("\n\n")


def join_lines(pars, lang, rng):
    """Hard-wrapped at a fixed width, as Chinese typesetting does (breaks fall
    inside Latin words), then the lines joined again without a space, and the
    paragraphs with them: "NAME\\nnetworkctl" becomes "NAMEnetworkctl". Every
    character is kept, in order."""
    lines = rewrap(pars, lang, rng)
    return ["".join(p.replace("\n", "") for p in lines)]


HALF = {"，": ",", "。": ".", "：": ":", "；": ";", "（": "(", "）": ")", "！": "!", "？": "?", "、": ","}
FULL = {",": "，", ".": "。", ":": "：", ";": "；", "(": "（", ")": "）", "!": "！", "?": "？"}


def widths(pars, lang, rng):
    """Punctuation of the other width here and there (full-width marks become
    ASCII and ASCII marks full-width), line ends CRLF, some paragraphs
    re-wrapped: the same characters, typeset differently."""
    out = []
    for p in pars:
        swap = rng.random() < 0.5
        if rng.random() < 0.5:
            p = rewrap([p], lang, rng)[0]
        p = "".join(
            (HALF.get(c) or FULL.get(c) or c) if swap and rng.random() < 0.7 else c for c in p
        )
        out.append(p.replace("\n", "\r\n"))
    return ["\r\n\r\n".join(out)]


def make_variant(pars, lang, rng, edit):
    if edit == "word_edits":
        return word_edits(pars, lang, rng, rng.choice([0.005, 0.01, 0.02, 0.03, 0.05]))
    if edit == "heavy_edits":
        return word_edits(pars, lang, rng, rng.choice([0.07, 0.1, 0.15, 0.25]))
    if edit == "boilerplate":
        return boilerplate(pars, lang, rng, rng.randrange(1, 4))
    if edit == "timestamps":
        return timestamps(pars, lang, rng)
    if edit == "rewrap":
        return rewrap(pars, lang, rng)
    if edit == "reorder":
        return reorder(pars, rng)
    if edit == "truncate":
        return truncate(pars, lang, rng, rng.choice([0.97, 0.93, 0.88, 0.82, 0.7]))
    if edit == "truncate_tail":
        return truncate_tail(pars, lang, rng, rng.choice([0.97, 0.93, 0.88, 0.82, 0.7]))
    if edit == "join_lines":
        return join_lines(pars, lang, rng)
    if edit == "widths":
        return widths(pars, lang, rng)
    if edit == "combined":
        out = pars
        for e in rng.sample(["word_edits", "boilerplate", "timestamps", "rewrap", "reorder", "truncate"], rng.randrange(2, 4)):
            if e == "truncate":
                out = truncate(out, lang, rng, rng.choice([0.97, 0.93, 0.88]))
            elif e == "word_edits":
                out = word_edits(out, lang, rng, rng.choice([0.005, 0.01, 0.02]))
            else:
                out = make_variant(out, lang, rng, e)
        return out
    raise ValueError(edit)


EDITS = ["word_edits", "heavy_edits", "boilerplate", "timestamps", "rewrap", "reorder", "truncate", "combined"]
# Chinese text is also re-typeset: lines joined without a space, punctuation of
# the other width, CRLF line ends; and cut at its beginning.
EDITS_BY_LANG = {"en": EDITS, "zh": EDITS + ["join_lines", "widths", "truncate_tail"]}


def build(lang: str, bases_wanted: int, seed: int, out_dir: str):
    rng = random.Random(f"{seed}:{lang}")
    bases = list(english_bases() if lang == "en" else chinese_bases())
    # Neighbouring sections of one manual: kept in order for the hard negatives.
    if len(bases) > bases_wanted:
        start = rng.randrange(0, len(bases) - bases_wanted + 1)
        bases = bases[start : start + bases_wanted]
    docs: list[tuple[str, str]] = []
    edits: list[tuple[str, str, str]] = []
    prefix = "e" if lang == "en" else "z"
    base_pars = []
    for i, (source, pars) in enumerate(bases):
        pars = list(pars)
        if rng.random() < 0.3:
            pars.insert(0, stamp(rng, lang))
        base_pars.append(pars)
        docs.append((f"{prefix}{i:05}", "\n\n".join(pars)))
    for i, pars in enumerate(base_pars):
        base_id = f"{prefix}{i:05}"
        r = rng.random()
        n = 0 if r < 0.45 else 1 if r < 0.8 else 2 if r < 0.95 else 3
        for j in range(n):
            edit = rng.choice(EDITS_BY_LANG[lang])
            docs.append((f"{base_id}-{edit}-{j}", "\n\n".join(make_variant(pars, lang, rng, edit))))
            edits.append((base_id, f"{base_id}-{edit}-{j}", edit))
        # Hard negatives: the next section of the same manual ...
        if i + 1 < len(base_pars) and rng.random() < 0.3:
            edits.append((base_id, f"{prefix}{i + 1:05}", "neighbour_section"))
    # ... and two different documents inside one large page template.
    pool = ZH_BOILER if lang == "zh" else EN_BOILER
    for t in range(len(base_pars) // 10):
        i, j = rng.sample(range(len(base_pars)), 2)
        header, footer = pool[:4], pool[4:]
        a = f"{prefix}{i:05}-template-{t}"
        b = f"{prefix}{j:05}-template-{t}"
        docs.append((a, "\n\n".join(header + base_pars[i] + footer)))
        docs.append((b, "\n\n".join(header + base_pars[j] + footer)))
        edits.append((a, b, "same_template"))
    rng.shuffle(docs)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "corpus.jsonl"), "w", encoding="utf-8") as f:
        for doc_id, text in docs:
            f.write(json.dumps({"id": doc_id, "text": text}, ensure_ascii=False) + "\n")
    with open(os.path.join(out_dir, "edits.jsonl"), "w", encoding="utf-8") as f:
        for a, b, e in edits:
            f.write(json.dumps({"a": a, "b": b, "edit": e}, ensure_ascii=False) + "\n")
    print(f"build_corpus: {lang}: {len(base_pars)} base documents, {len(docs)} documents, {len(edits)} labelled pairs -> {out_dir}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder (OUT/en, OUT/zh)")
    ap.add_argument("--lang", choices=["en", "zh", "all"], default="all")
    ap.add_argument("--bases", type=int, default=1500, help="base documents per language")
    ap.add_argument("--seed", type=int, default=2007)
    args = ap.parse_args()
    for lang in ["en", "zh"] if args.lang == "all" else [args.lang]:
        build(lang, args.bases, args.seed, os.path.join(args.out, lang))


if __name__ == "__main__":
    main()
