#!/usr/bin/env bash
# bench_tok_families.sh - `asyncpp bench tokenizer`'s table of families
# (not its figures: tests never assert timings): without peers every row
# says why it was skipped; with the npm packages (installed by the bench
# itself into the peers folder, or $ASYNCPP_HF_NPM's) the cl100k row times
# every peer after checking its ids, and a peer whose ids differ (native
# tiktoken takes "<|endoftext|>" as the special token, asyncpp as text) is
# named and fails the command instead of being timed.
. "$ROOT/tests/lib.sh"
A=$ASYNCPP

python3 -c "import sys; sys.stdout.write('In the beginning God created the heaven and the earth. ' * 300)" > t.txt
{ printf 'Hello <|endoftext|> world\n'; cat t.txt; } > special.txt

# no peers: every family (7) skipped, no verdict
mkdir -p empty
$A bench tokenizer --families-only --no-js --peers empty --text t.txt > out.txt 2> err.txt
rc=$?
if [ $rc -eq 0 ] && [ "$(grep -c '^| .* | skipped: no .* in the peers folder' out.txt)" = 7 ] &&
	! grep -q '^target:' out.txt; then
	pass no_peers_all_skipped
else
	fail no_peers_all_skipped "exit $rc: $(head -c 400 out.txt err.txt)"
fi
expect_exit 2 unknown_family -- $A bench tokenizer --family cl99k --text t.txt

NPM=${ASYNCPP_HF_NPM:-$TMPDIR/npm}
if ! command -v node > /dev/null || ! command -v npm > /dev/null; then
	skip cl100k_peers_timed "no node or npm"
	skip ids_differ_named "no node or npm"
	exit 0
fi
mkdir -p "$NPM"
timeout 300 $A bench tokenizer --families-only --family cl100k --peers "$NPM" --text t.txt \
	> out.txt 2> err.txt
rc=$?
row=$(grep '^| cl100k |' out.txt)
if grep -q 'npm install failed' out.txt; then
	skip cl100k_peers_timed "npm install failed (no network?)"
	skip ids_differ_named "npm install failed (no network?)"
	exit 0
fi
# asyncpp's figure, the fastest peer and a ratio; each of the three peers a figure
if [ $rc -eq 0 ] && [[ "$row" =~ ^\|\ cl100k\ \|\ [0-9.]+\ \|\ [^|]+\ \|\ [0-9.]+\ \|\ \*\*[0-9.]+x\*\*\ \| ]] &&
	[[ "$row" == *"tiktoken-node (native Rust) "[0-9]* ]] &&
	[[ "$row" == *"tiktoken (WebAssembly) "[0-9]* ]] && [[ "$row" == *"gpt-tokenizer (JS) "[0-9]* ]] &&
	[ "$(grep -c '^| ' out.txt)" = 2 ] && grep -q '^target: .*: \(met\|NOT MET\)$' out.txt; then
	pass cl100k_peers_timed
else
	fail cl100k_peers_timed "exit $rc: $(head -c 600 out.txt err.txt)"
fi
$A bench tokenizer --families-only --family cl100k --peers "$NPM" --text special.txt \
	> out.txt 2> err.txt
rc=$?
row=$(grep '^| cl100k |' out.txt)
if [ $rc -eq 1 ] && [[ "$row" == *"tiktoken-node (native Rust): IDS DIFFER from asyncpp's at token "* ]] &&
	[[ "$row" == *"gpt-tokenizer (JS) "[0-9]* ]] && grep -q "a peer's ids differ" err.txt &&
	grep -q 'not judged' out.txt; then
	pass ids_differ_named
else
	fail ids_differ_named "exit $rc: $(head -c 600 out.txt err.txt)"
fi
