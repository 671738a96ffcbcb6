#!/usr/bin/env python3
"""jsonl_samples.py KJV_TXT OUTDIR - the JSONL files bench/jsonl_libs.c was
measured on (bench/NOTES.md, issue 17):

  kjv5.jsonl       the KJV five times over in documents of about 2000 bytes
                   of whole lines, with "id" and "url" beside "text" (ASCII)
  mixed.jsonl      20000 synthetic web-like records, five metadata members;
                   each word drawn from Latin, CJK, Cyrillic, Arabic,
                   Devanagari, emoji, quotes, backslashes and tabs, so the
                   script changes every word; raw UTF-8
  mixed_ascii.jsonl the same records with every non-ASCII character a \\u
                   escape (Python's json.dumps default)
  onelang.jsonl    20000 records of one language each (German, Japanese,
                   Russian or Chinese words); raw UTF-8
"""
import json
import os
import random
import sys

kjv, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)

lines = [l for l in open(kjv, encoding="utf-8").read().split("\n") if l.strip()]
docs, cur, n = [], [], 0
for l in lines:
    cur.append(l)
    n += len(l) + 1
    if n >= 2000:
        docs.append("\n".join(cur) + "\n\n")
        cur, n = [], 0
if cur:
    docs.append("\n".join(cur) + "\n\n")
with open(os.path.join(out, "kjv5.jsonl"), "w") as f:
    for i, d in enumerate(docs * 5):
        f.write(json.dumps({"id": i, "url": "https://example.org/%d" % i, "text": d}) + "\n")

random.seed(1)
words = ["the", "and", "Straße", "über", "café", "naïve", "日本語", "テキスト", "中文", "文本",
         "Москва", "текст", "العربية", "नमस्ते", "😀", "🚀", '"quoted"', "back\\slash",
         "tab\there", "<b>html</b>", "https://example.org/a?b=c&d=e"]
with open(os.path.join(out, "mixed.jsonl"), "w") as f, \
        open(os.path.join(out, "mixed_ascii.jsonl"), "w") as g:
    for i in range(20000):
        paras = [" ".join(random.choice(words) for _ in range(random.randint(20, 120)))
                 for _ in range(random.randint(1, 6))]
        rec = {"id": i, "url": "https://example.org/%d" % i, "date": "2024-01-01",
               "meta": {"lang": "mul", "score": 0.93, "tags": ["a", "b"]},
               "text": "\n\n".join(paras)}
        f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        g.write(json.dumps(rec) + "\n")

random.seed(2)
langs = [
    "der die und in den von zu das mit sich des auf für ist im dem nicht ein Straße über "
    "Mädchen größer schön Übung Fußgänger".split(),
    "日本語 の テキスト を 書く こと は 難しい です が 楽しい 東京 大阪 京都 山 川 海 空".split(),
    "и в не на я быть он с что а по это она этот к но они мы как из у который то за свой "
    "Москва".split(),
    "中文 文本 的 是 在 不 了 有 和 人 这 中 大 为 上 个 国 我 以 要 他".split(),
]
with open(os.path.join(out, "onelang.jsonl"), "w") as f:
    for i in range(20000):
        w = random.choice(langs)
        paras = [" ".join(random.choice(w) for _ in range(random.randint(30, 150))) + "."
                 for _ in range(random.randint(1, 5))]
        f.write(json.dumps({"id": i, "url": "https://example.org/%d" % i,
                            "text": "\n\n".join(paras)}, ensure_ascii=False) + "\n")
