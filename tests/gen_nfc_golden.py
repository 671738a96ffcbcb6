#!/usr/bin/env python3
"""gen_nfc_golden.py - write testdata/nfc_golden.txt, the cases
tests/unit/test_unicode_nfc.c checks io/text/unicode_nfc.c against: Python's
unicodedata.normalize('NFC', ...) (an implementation written apart from
ours). One case per line: the input, a tab, its NFC form (UTF-8).

Every code point that NFC could touch (a canonical decomposition, a non-zero
combining class, or the second of a composition pair) in four forms: alone,
its NFD, after an 'a' with a grave accent and before an acute (so that it
meets marks of other classes), and its NFD reversed; every 97th Hangul
syllable as jamo (LV and LVT); and 3000 random sequences of starters and
combining marks. The first line names the Unicode version.

Usage: python3 tests/gen_nfc_golden.py > testdata/nfc_golden.txt
"""
import random
import sys
import unicodedata

N = unicodedata.normalize
out = sys.stdout
out.write("unicode\t%s\n" % unicodedata.unidata_version)
touch, marks = [], []
for cp in range(0x110000):
    if 0xD800 <= cp < 0xE000:
        continue
    c = chr(cp)
    d = unicodedata.decomposition(c)
    if (d and not d.startswith("<")) or unicodedata.combining(c) or N("NFC", c) != c:
        touch.append(c)
    if unicodedata.combining(c):
        marks.append(c)
seconds = set()
for c in touch:
    d = unicodedata.decomposition(c)
    if d and not d.startswith("<") and len(d.split()) == 2:
        seconds.add(chr(int(d.split()[1], 16)))
seen = set()


def case(s):
    if "\n" in s or "\t" in s or s in seen:
        return
    seen.add(s)
    out.write("%s\t%s\n" % (s, N("NFC", s)))


for c in touch + sorted(seconds):
    case(c)
    case(N("NFD", c))
    case("a\u0300" + c + "\u0301")
    case(N("NFD", c)[::-1])
for cp in range(0xAC00, 0xD7A4, 97):
    case(N("NFD", chr(cp)))
    case(N("NFD", chr(cp)) + "\u11a8")
rnd = random.Random(30)
starters = list("aeiouAEOUcnsyzklr") + ["\u1100", "\u1161", "\u11a8", "\u0915", "\u05d0",
                                        "\u3042", "\u0627", "\u03b1", "\u0399", "\u0985"]
pool = marks + sorted(seconds)
for _ in range(3000):
    s = ""
    for _ in range(rnd.randint(1, 8)):
        s += rnd.choice(starters) if rnd.random() < 0.4 else rnd.choice(pool)
    case(s)
