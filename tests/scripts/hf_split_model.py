"""hf_split_model.py - a Python model of Hugging Face's Split pre-tokenizer
and byte-level BPE, for tokenizer_split_regex.sh and tokenizer_split_chain.sh:
the onig crate's find_iter and Pattern::find_matches, the behaviors' folds of
NormalizedString::split (written from tokenizers' source), then BPE over a
small merge list; tokenizer(steps) is the tokenizer.json of a chain of Splits
(one step or more) before ByteLevel(use_regex false)."""
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs = bs[:]
for b in range(256):
    if b not in bs:
        bs.append(b)
        cs.append(256 + len(cs) - 188)
U = {b: chr(c) for b, c in zip(bs, cs)}
t = lambda s: "".join(U[b] for b in s)
MERGES = [(b"t", b"h"), (b"th", b"e"), (b" ", b"t"), (b"1", b"2"), (b"e", b" "), (b"x", b"x"),
          (b"\n", b"\n"), (b" ", b" ")]
BL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
def split_json(regex, behavior, invert):
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": behavior, "invert": invert}
def tokenizer(steps):
    vocab = {U[b]: b for b in range(256)}
    ms = []
    for a, b in MERGES:
        ms.append([t(a), t(b)])
        vocab[t(a + b)] = len(vocab)
    return {"version": "1.0", "added_tokens": [
        {"id": len(vocab), "content": "<|endoftext|>", "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None, "pre_tokenizer": {"type": "Sequence", "pretokenizers":
            [split_json(*s) for s in steps] + [BL]},
        "post_processor": BL, "decoder": BL,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False,
                  "byte_fallback": False, "vocab": vocab, "merges": ms}}

def find_matches(rx, s):  # onig crate's FindMatches, then Pattern::find_matches
    out, prev, last_end, last_match_end = [], 0, 0, None
    while last_end <= len(s):
        m = rx.search(s, last_end)
        if not m:
            break
        b, e = m.span()
        if b == e and last_match_end == e:
            last_end += 1
            continue
        last_end = last_match_end = e
        if prev != b:
            out.append([prev, b, False])
        out.append([b, e, True])
        prev = e
    if prev != len(s):
        out.append([prev, len(s), False])
    return out

def split(rx, s, behavior, invert):  # NormalizedString::split
    m = [[a, b, (not x) if invert else x] for a, b, x in find_matches(rx, s)]
    acc, prev = [], False
    if behavior == "Removed":
        acc = [x for x in m if not x[2]]
    elif behavior == "Isolated":
        acc = m
    elif behavior == "MergedWithPrevious":
        for x in m:
            if x[2] and not prev and acc:
                acc[-1][1] = x[1]
            else:
                acc.append(list(x))
            prev = x[2]
    elif behavior == "MergedWithNext":
        for x in reversed(m):
            if x[2] and not prev and acc:
                acc[-1][0] = x[0]
            else:
                acc.append(list(x))
            prev = x[2]
        acc.reverse()
    elif behavior == "Contiguous":
        for x in m:
            if x[2] == prev and acc:
                acc[-1][1] = x[1]
            else:
                acc.append(list(x))
            prev = x[2]
    return [s[a:b] for a, b, _ in acc if a != b]

def bpe(piece):  # the lowest rank first, leftmost on ties
    ranks = {(a, b): r for r, (a, b) in enumerate(MERGES)}
    syms = [bytes([c]) for c in piece]
    while len(syms) > 1:
        best = min(range(len(syms) - 1), key=lambda i: (ranks.get((syms[i], syms[i + 1]),
                                                                  1 << 30), i))
        if (syms[best], syms[best + 1]) not in ranks:
            break
        syms[best:best + 2] = [syms[best] + syms[best + 1]]
    ids = {bytes([b]): b for b in range(256)}
    for i, (a, b) in enumerate(MERGES):
        ids[a + b] = 256 + i
    return [ids[x] for x in syms]
