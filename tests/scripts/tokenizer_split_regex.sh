#!/usr/bin/env bash
# tokenizer_split_regex.sh - a tokenizer.json Split with any regex, behavior
# and invert (`tokenize import-hf`, through PCRE2): on small generated
# tokenizer.json files, the ids must be those of a Python model of Hugging
# Face's Split (the onig crate's find_iter, Pattern::find_matches, the
# behaviors' folds of NormalizedString::split, written from tokenizers'
# source) followed by BPE, for every behavior, inverted or not, over ASCII
# patterns with empty matches, lookbehind and line anchors; regexes that
# Oniguruma reads otherwise are refused by JSON path; inspect shows the
# regex. Then, where npm and node run, the ids must be those of Hugging
# Face's tokenizers (npm @huggingface/tokenizers, which implements Isolated,
# Removed and invert with Removed) for Unicode patterns (o200k's pattern as a
# Split regex, \s with U+0085) on the stress texts and random mixes. A
# match that runs out of PCRE2's limits makes encode fail.
# Without PCRE2 in the build everything SKIPs but the refusal saying so.
. "$ROOT/tests/lib.sh"
A=$ASYNCPP
REF=$ROOT/tests/scripts/tokenizer_hf_ref.js

export PYTHONPATH=$ROOT/tests/scripts  # hf_split_model.py
cat > mk.py << 'PY'
import json, sys
from hf_split_model import *

if sys.argv[1] == "json":
    json.dump(tokenizer([(sys.argv[2], sys.argv[3], sys.argv[4] == "1")]), sys.stdout)
else:  # cases FILE: c_K.json and c_K.want (the model's ids of FILE) for each case
    import re
    text = open(sys.argv[2], "rb").read()
    k = 0
    for regex in ["\\s+", "[0-9]", "th", " ?[a-z]+", "e|\\s", "x*", "(?<=t)h", "^t", "e$",
                  "(?=e)"]:
        rx = re.compile(regex.encode(), re.M)
        for behavior in ["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                         "Contiguous"]:
            for invert in [False, True]:
                json.dump(tokenizer([(regex, behavior, invert)]), open("c_%d.json" % k, "w"))
                ids = [i for p in split(rx, text, behavior, invert) for i in bpe(p)]
                open("c_%d.want" % k, "w").write(" ".join(map(str, ids)) + "\n")
                k += 1
    print(k)
PY

python3 mk.py json '\s+' Isolated 0 > probe.json
if ! $A tokenize import-hf -o probe.tok probe.json > out.txt 2> err.txt; then
	if grep -q 'built without PCRE2' err.txt; then
		pass refused_without_pcre2
		skip split_regex "this asyncpp was built without PCRE2 (libpcre2-dev)"
		exit 0
	fi
	fail import_probe "$(head -c 300 err.txt)"
fi

printf 'the 12 then  the\te 123 thee x\n\nthe xx exe\n the\r\nxxx 12 12\n' > t.txt
bad=
ncases=$(python3 mk.py cases t.txt)
k=$(first_case_differing "$ncases" t.txt)
[ -z "$k" ] ||
	bad="case $k ($(python3 -c "import json, sys; p = json.load(open(sys.argv[1]))[
	'pre_tokenizer']['pretokenizers'][0]; print(p['pattern']['Regex'], p['behavior'],
	'inverted' if p['invert'] else '')" c_$k.json)): '$(head -c 200 got.txt)', model '$(cat c_$k.want)'"
if [ -z "$bad" ]; then pass "behaviors_equal_model ($ncases cases)";
else fail behaviors_equal_model "$bad"; fi

# the hand-written scanners against PCRE2: Llama 3's and Qwen's regexes,
# wrapped in (?:...) so that no scanner recognises them, split as the
# scanners do (the ids over the stress texts are the same)
CL100K="(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
CL100K="$CL100K| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
QWEN=${CL100K/\\p\{N\}\{1,3\}/\\p\{N\}}
cat "$TESTDATA/tiktoken_stress.txt" "$TESTDATA/nfc_stress.txt" > st.txt
bad=
for re in "$CL100K" "$QWEN"; do
	python3 mk.py json "$re" Isolated 0 > k.json
	python3 mk.py json "(?:$re)" Isolated 0 > x.json
	rm -f k.tok x.tok
	$A tokenize import-hf -o k.tok k.json > e.txt 2>&1 && $A tokenize import-hf -o x.tok x.json \
		>> e.txt 2>&1 || { bad="import: $(head -c 200 e.txt)"; break; }
	if $A inspect k.tok | grep -q 'Split regex' || ! $A inspect x.tok | grep -q 'Split regex'; then
		bad="the scanner's kind was not chosen for the bare regex"
		break
	fi
	$A tokenize encode -q -t k.tok --ids st.txt > k.ids && $A tokenize encode -q -t x.tok --ids \
		st.txt > x.ids
	cmp -s k.ids x.ids || { bad="${re:0:50}: $(cmp k.ids x.ids)"; break; }
done
if [ -z "$bad" ]; then pass scanners_equal_pcre2; else fail scanners_equal_pcre2 "$bad"; fi

# lossless behaviors decode to the text; Removed drops the matches
python3 mk.py json '\s+' MergedWithNext 1 > m.json
rm -f m.tok r_train.shard back.txt
$A tokenize import-hf -o m.tok m.json && $A tokenize encode -q -t m.tok -o r --val-fraction 0 \
	t.txt && $A tokenize decode -t m.tok -o back.txt r_train.shard
if cmp -s t.txt back.txt; then pass merged_roundtrip;
else fail merged_roundtrip "decoded differs"; fi
$A inspect m.tok > insp.txt 2>&1
if grep -qF 'pre-tokenizer:  Split regex \s+ (MergedWithNext, inverted; PCRE2)' insp.txt; then
	pass inspect_shows_regex; else fail inspect_shows_regex "$(sed -n 3p insp.txt)"; fi

refused() { # NAME WANT-IN-STDERR REGEX
	python3 mk.py json "$3" Isolated 0 > r.json
	rm -f bad.tok
	$A tokenize import-hf -o bad.tok r.json > out.txt 2> err.txt
	local rc=$?
	if [ "$rc" -eq 1 ] && grep -qF -- "$2" err.txt && [ ! -e bad.tok ]; then pass "$1";
	else fail "$1" "exit $rc, wanted 1 and '$2': $(head -c 300 err.txt)"; fi
}
P=pre_tokenizer.pretokenizers[0].pattern.Regex
refused refuse_onig_hex "$P: \\h means another thing in Oniguruma" '\h+'
refused refuse_onig_word "$P: \\w: Oniguruma's word characters are not PCRE2's" '\w+'
refused refuse_onig_intersection "$P: class intersection (Oniguruma's &&)" '[a-z&&[^aeiou]]'
refused refuse_onig_nested_class "$P: a class within a class" '[a[bc]]'
refused refuse_onig_absent "$P: Oniguruma's absent operator" '(?~abc)'
refused refuse_onig_option "$P: the inline option (?m) is not implemented" '(?m:a.b)'
refused refuse_pcre2_syntax "$P: PCRE2 refuses the regex" '(a'

# a match that runs out of PCRE2's limits (nested quantifiers backtracking
# exponentially), even retried with raised ones, is never silent: encode
# fails naming the regex, and writes no shard
python3 mk.py json '(a+)+$' Isolated 0 > p.json
python3 -c "print('the ' + 'a' * 40 + '!')" > pa.txt
rm -f p.tok pa_train.shard pa_val.shard
$A tokenize import-hf -o p.tok p.json > /dev/null 2>&1
$A tokenize encode -q -t p.tok -o pa --val-fraction 0 pa.txt > out.txt 2> err.txt
rc=$?
if [ "$rc" -eq 1 ] && grep -qF 'the Split regex (a+)+$ ran out of PCRE2' err.txt &&
	grep -qF 'no shard was written' err.txt && ! ls pa_* > /dev/null 2>&1; then
	pass match_limit_fails
else
	fail match_limit_fails "exit $rc, $(ls pa_* 2> /dev/null) $(head -c 300 err.txt)"
fi
$A tokenize encode -q -t p.tok --ids pa.txt > out.txt 2> err.txt
rc=$?
if [ "$rc" -eq 1 ] && grep -qF 'ran out of PCRE2' err.txt; then pass match_limit_fails_ids;
else fail match_limit_fails_ids "exit $rc: $(head -c 300 err.txt)"; fi

# ---- against Hugging Face's tokenizers
if ! npm_packages @huggingface/tokenizers@0:package.json; then
	skip hf_unicode_regexes "npm packages unavailable (no node, npm or network)"
	exit 0
fi
HF=$NPM/node_modules/@huggingface/tokenizers
python3 - > mix.txt << 'PY'
import random, sys
random.seed(7)
pool = list("aAbBsStTlLvVeErRdDmM'/ \n\r\t.,!?-0123456789_\"#:") + [
    "\u0301", "\u0903", "\u01c5", "\u02b0", "\u3042", "\u4e2d", "\u00e9", "\u00c9", "\u03a3",
    "\u00a0", "\u3000", "\u200b", "\u0085", "\u2028", "\u0663", "\u00b2", "\u216b",
    "\U0001F600", "\u200d", "\u0915", "\u094d", "\u05d0", "\u0627"]
out = []
for _ in range(20000):
    k = random.randint(1, 6)
    out.append("".join(random.choice(pool) for _ in range(k)))
sys.stdout.write("".join(out))
PY
cat "$TESTDATA/tiktoken_stress.txt" "$TESTDATA/nfc_stress.txt" mix.txt |
	sed 's/<|endoftext|>//g' > u.txt
UP='[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]' LO='[\p{Ll}\p{Lm}\p{Lo}\p{M}]'
CON="(?i:'s|'t|'re|'ve|'m|'ll|'d)?" PRE='[^\r\n\p{L}\p{N}]?'
O200K="$PRE$UP*$LO+$CON|$PRE$UP+$LO*$CON|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*"
O200K="$O200K|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" # o200k's pattern, as a Split regex
bad=
for c in "$O200K;Isolated;0" '\p{L}+|\p{N};Isolated;0' '\s+;Removed;0' '\p{Lu}\p{Ll}*;Removed;1' \
	' ?\p{P}+|\s+(?!\S);Isolated;0'; do
	IFS=';' read -r re beh inv <<< "$c"
	python3 mk.py json "$re" $beh $inv > h.json
	rm -f h.tok
	$A tokenize import-hf -o h.tok h.json > /dev/null 2> h.err
	node "$REF" "$HF" added h.json u.txt > js.ids 2> js.err
	$A tokenize encode -q -t h.tok --ids u.txt > c.ids 2>> h.err
	if ! [ -s js.ids ] || ! cmp -s js.ids c.ids; then
		bad="${re:0:40} $beh $inv: $(cmp js.ids c.ids 2>&1 | head -c 100)"
		bad="$bad $(head -c 200 h.err js.err)"
		break
	fi
done
if [ -z "$bad" ]; then pass hf_unicode_regexes; else fail hf_unicode_regexes "$bad"; fi
