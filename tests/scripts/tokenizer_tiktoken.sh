#!/usr/bin/env bash
# tokenizer_tiktoken.sh - `tokenize import-tiktoken`: the reader's refusals
# (name file:line) on a small generated rank file, then, where npm and node
# run, cl100k_base and o200k_base against tiktoken itself (the npm package
# tiktoken: OpenAI's Rust code built to WebAssembly, with the rank files):
# the ids `tokenize encode --ids` prints must be tiktoken's on a multilingual
# stress text (testdata/tiktoken_stress.txt), on random mixes of the
# characters the patterns treat apart, on long runs, and on 600 KB of the
# King James Bible (more than one 256 KB piece, so the threads' cutting is
# checked too); --pattern with cl100k's regex string gives --pattern
# cl100k's ids. The
# package is installed with npm (tests/lib.sh npm_packages, once a suite run) at test time, or taken from
# $ASYNCPP_TIKTOKEN_PKG; without it those checks SKIP.
. "$ROOT/tests/lib.sh"
A=$ASYNCPP
REF=$ROOT/tests/scripts/tokenizer_tiktoken_ref.js

# ---- the reader, on a small rank file: the 256 bytes, then "ab" and "abc"
python3 - > small.tiktoken << 'EOF'
import base64
toks = [bytes([b]) for b in range(256)] + [b"ab", b"abc"]
for r, t in enumerate(toks):
    print(base64.b64encode(t).decode(), r)
EOF
expect_exit 0 import_small -- $A tokenize import-tiktoken -o small.tok --pattern cl100k \
	--special '<|endoftext|>=300' --special '<|mine|>=260' small.tiktoken
# --special moves <|endoftext|> from cl100k's 100257 and adds <|mine|>
$A inspect small.tok > insp.txt 2>&1
if grep -q 'format version 2' insp.txt && grep -q 'cl100k pattern' insp.txt &&
	grep -q 'special token:  300 "<|endoftext|>" (end of text)' insp.txt &&
	grep -q 'special token:  260 "<|mine|>"' insp.txt &&
	! grep -q 'special token:  100257' insp.txt; then
	pass inspect_small
else
	fail inspect_small "$(head -c 400 insp.txt)"
fi
printf 'abc abcabc' > abc.txt
got=$($A tokenize encode -q -t small.tok --ids abc.txt 2>&1)
if [ "$got" = "257 32 257 257" ]; then pass encode_small; else fail encode_small "ids '$got'"; fi

refused() { # NAME WANT-IN-STDERR CMD... : exit 1 naming the problem, no output file
	local name=$1 want=$2
	shift 2
	rm -f bad.tok
	"$@" > out.txt 2> err.txt
	local rc=$?
	if [ "$rc" -eq 1 ] && grep -qF -- "$want" err.txt && [ ! -e bad.tok ]; then pass "$name";
	else fail "$name" "exit $rc, wanted 1 and '$want': $(head -c 300 err.txt)"; fi
}
sed '258s/.*/YW*j 257/' small.tiktoken > b64.tiktoken
refused bad_base64 "b64.tiktoken:258: the token is not valid base64" \
	$A tokenize import-tiktoken -o bad.tok --pattern cl100k b64.tiktoken
sed '258s/.*/YWI= 257/' small.tiktoken > dup.tiktoken
refused duplicate_token "dup.tiktoken:258: the token of rank 257 repeats line 257's (rank 256)" \
	$A tokenize import-tiktoken -o bad.tok --pattern cl100k dup.tiktoken
sed '258s/ 257$/ 256/' small.tiktoken > duprank.tiktoken
refused duplicate_rank "duprank.tiktoken:258: rank 256 repeats line 257's" \
	$A tokenize import-tiktoken -o bad.tok --pattern cl100k duprank.tiktoken
sed '258s/ 257$/ 400/' small.tiktoken > gap.tiktoken
refused gap "gap.tiktoken:258: rank 400, but rank 257 is missing" \
	$A tokenize import-tiktoken -o bad.tok --pattern cl100k gap.tiktoken
sed '258s/.*/eHl6 257/' small.tiktoken > nomerge.tiktoken
refused not_a_merge "nomerge.tiktoken:258: the token of rank 257 is not the merge of two" \
	$A tokenize import-tiktoken -o bad.tok --pattern cl100k nomerge.tiktoken
refused special_in_ranks "special token <|x|> has id 5, a rank of the file" \
	$A tokenize import-tiktoken -o bad.tok --pattern cl100k --special '<|x|>=5' small.tiktoken
refused which_pattern "258 ranks, neither cl100k_base's (100256), o200k_base's (199998) nor Llama 3's (128000)" \
	$A tokenize import-tiktoken -o bad.tok small.tiktoken
usage_error() { # NAME WANT-IN-STDERR CMD...: exit 2 with that message
	local name=$1 want=$2
	shift 2
	"$@" > out.txt 2> err.txt
	local rc=$?
	if [ "$rc" -eq 2 ] && grep -qF -- "$want" err.txt; then pass "$name";
	else fail "$name" "exit $rc, wanted 2 and '$want': $(head -c 300 err.txt)"; fi
}
# any other --pattern is a regex (PCRE2, Isolated), with no special tokens
# but --special's
refused bad_pattern_regex "--pattern: PCRE2 refuses the regex" \
	$A tokenize import-tiktoken -o bad.tok --pattern '(a' small.tiktoken
rm -f rx.tok
$A tokenize import-tiktoken -o rx.tok --pattern '\s+|[a-z]+' --special '<|endoftext|>=300' \
	small.tiktoken > out.txt 2> err.txt
printf 'abc ab  abcab\n' > rx.txt
got=$($A tokenize encode -q -t rx.tok --ids rx.txt 2>&1)
$A inspect rx.tok > insp.txt 2>&1
if [ "$got" = "257 32 256 32 32 257 256 10" ] &&
	grep -qF 'pre-tokenizer:  Split regex \s+|[a-z]+ (Isolated; PCRE2)' insp.txt &&
	grep -qF 'special token:  300 "<|endoftext|>" (end of text)' insp.txt &&
	[ "$(grep -c '^special token:' insp.txt)" = 1 ]; then
	pass pattern_regex_small
elif grep -q 'built without PCRE2' err.txt; then
	skip pattern_regex_small "this asyncpp was built without PCRE2 (libpcre2-dev)"
else
	fail pattern_regex_small "ids '$got', $(head -c 200 err.txt) $(sed -n 3p insp.txt)"
fi
usage_error bad_special "--special wants NAME=ID with an id below 16777216, not '<|x|>'" \
	$A tokenize import-tiktoken -o bad.tok --special '<|x|>' small.tiktoken

# ---- against tiktoken
PKG=${ASYNCPP_TIKTOKEN_PKG:-}
if [ -z "$PKG" ] || [ ! -f "$PKG/encoders/cl100k_base.json" ]; then
	PKG=$TMPDIR/npm/node_modules/tiktoken
	if command -v npm > /dev/null; then
		mkdir -p "$TMPDIR/npm"
		(cd "$TMPDIR/npm" && timeout 180 npm install --no-audit --no-fund tiktoken@1) \
			> npm.log 2>&1
	fi
fi
if [ ! -f "$PKG/encoders/cl100k_base.json" ] || ! command -v node > /dev/null; then
	for e in cl100k o200k; do
		for t in import stress mix long kjv roundtrip; do
			skip ${e}_$t "npm package tiktoken unavailable (no node, npm or network)"
		done
	done
	exit 0
fi

for seed in 1 2 3; do
	python3 - $seed > mix$seed.txt << 'EOF'
import random, sys
random.seed(int(sys.argv[1]))
pool = list("aAbBsStTlLvVeErRdDmM'/ \n\r\t.,!?-0123456789_\"#") + [
    "\u0301", "\u0903", "\u01c5", "\u01c8", "\u02b0", "\u3042", "\u4e2d", "\u00e9", "\u00c9",
    "\u03a3", "\u03c3", "\u017f", "\u0085", "\u00a0", "\u2028", "\u3000", "\ufeff", "\u200b",
    "\u0663", "\u00b2", "\u216b", "\U0001F600", "\U0001F3FD", "\u200d", "\u0915", "\u094d",
    "\u0937", "\u0e44", "\u05d0", "\u0627", "\x1c", "\x0b", "\x0c", "\u1680", "\u2000", "\u00bd"]
out = []
for _ in range(20000):
    k = random.randint(1, 6)
    c = random.choice(pool)
    out.append(c * k if random.random() < 0.3 else "".join(random.choice(pool) for _ in range(k)))
sys.stdout.write("".join(out))
EOF
done
# long runs: pieces past the BPE's short-piece scan (its heap), and tokens of
# 128 spaces
python3 -c "import sys; sys.stdout.write('x' + ' ' * 300 + 'y\n' + '!' * 1000 + '\n' +
    '7' * 200 + ' ' + 'a' * 500 + 'Z' * 300 + 'b' * 200 + '\n' + '\t' * 150 + '\r\n' * 80 +
    '\u00e9' * 300 + ' ' + '\u4f60' * 400 + '\U0001F600' * 100 + ' ' * 129 + 'end' +
    '\n' * 10 + ' ' * 130)" > long.txt
have_kjv=0
kjv_text kjv.txt 600000 && have_kjv=1

compare() { # NAME ENC TOK FILE...: the ids of each FILE
	local name=$1 enc=$2 tok=$3 f bad=
	shift 3
	for f in "$@"; do
		node "$REF" "$PKG" ids "$enc" "$f" > js.ids 2> js.err
		$A tokenize encode -q -j 4 -t "$tok" --ids "$f" > c.ids 2> c.err
		if ! [ -s js.ids ] || ! cmp -s js.ids c.ids; then
			bad="$f: $(cmp js.ids c.ids 2>&1 | head -c 200) $(head -c 200 js.err c.err)"
			break
		fi
	done
	if [ -z "$bad" ]; then pass "$name"; else fail "$name" "ids differ from tiktoken's: $bad"; fi
}

for e in cl100k o200k; do
	node "$REF" "$PKG" ranks ${e}_base > $e.tiktoken
	# no --pattern: told by the number of ranks
	expect_exit 0 ${e}_import -- $A tokenize import-tiktoken -o $e.tok $e.tiktoken
	compare ${e}_stress ${e}_base $e.tok "$TESTDATA/tiktoken_stress.txt"
	compare ${e}_mix ${e}_base $e.tok mix1.txt mix2.txt mix3.txt
	compare ${e}_long ${e}_base $e.tok long.txt
	if [ $have_kjv = 1 ]; then
		compare ${e}_kjv ${e}_base $e.tok kjv.txt
	else
		skip ${e}_kjv "no bible-kjv (Debian package bible-kjv)"
	fi
	cat "$TESTDATA/tiktoken_stress.txt" mix1.txt > all.txt
	rm -f r_train.shard back.txt # (not the last encoding's)
	$A tokenize encode -q -t $e.tok -o r --val-fraction 0 all.txt &&
		$A tokenize decode -t $e.tok -o back.txt r_train.shard
	if cmp -s all.txt back.txt; then pass ${e}_roundtrip;
	else fail ${e}_roundtrip "decoded bytes differ"; fi
done

# --pattern REGEX with cl100k's regex string (as Llama 3's tokenizer.json
# has it) gives --pattern cl100k's ids, through PCRE2
CL100K="(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
CL100K="$CL100K| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
rm -f cl100k_rx.tok
if $A tokenize import-tiktoken -o cl100k_rx.tok --pattern "$CL100K" \
	--special '<|endoftext|>=100257' cl100k.tiktoken > out.txt 2> err.txt; then
	bad=
	for f in "$TESTDATA/tiktoken_stress.txt" mix1.txt long.txt; do
		$A tokenize encode -q -t cl100k.tok --ids "$f" > a.ids 2>&1
		$A tokenize encode -q -t cl100k_rx.tok --ids "$f" > b.ids 2>&1
		cmp -s a.ids b.ids || { bad="$f: $(cmp a.ids b.ids 2>&1 | head -c 100)"; break; }
	done
	if [ -z "$bad" ]; then pass cl100k_pattern_regex; else fail cl100k_pattern_regex "$bad"; fi
elif grep -q 'built without PCRE2' err.txt; then
	skip cl100k_pattern_regex "this asyncpp was built without PCRE2 (libpcre2-dev)"
else
	fail cl100k_pattern_regex "$(head -c 300 err.txt)"
fi
