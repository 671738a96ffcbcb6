#!/usr/bin/env bash
# tokenize_corpora.sh - corpora as they ship: the same documents as plain
# text, JSONL, JSONL.zst, JSONL.gz, text.gz, a directory, a glob and stdin
# give identical shards (and tokenizers); lines with CRLF; bad JSONL records
# named by file and line; the val split by document hash (the same documents
# for a reordered input) and its fallback to position.
. "$ROOT/tests/lib.sh"
A=$ASYNCPP
C=$TESTDATA/corpus

same() { # NAME PREFIX_A PREFIX_B: both shards equal
	if cmp -s "$2_train.shard" "$3_train.shard" && cmp -s "$2_val.shard" "$3_val.shard"; then
		pass "$1"
	else
		fail "$1" "$3 shards differ from $2's"
	fi
}

# Every paragraph of the built-in corpus is a document: "PARA\n\n" in
# plain.txt, {"text": "PARA\n\n"} in c.jsonl, PARA alone in lines.txt (CRLF)
# and {"text": "PARA"} in short.jsonl. One more document uses \u escapes.
awk 'NF {
	s = $0; gsub(/\\/, "\\\\", s); gsub(/"/, "\\\"", s); gsub(/\t/, "\\t", s)
	n++
	printf "%s\n\n", $0 > "plain.txt"
	printf "{\"id\": %d, \"meta\": {\"text\": [1, 2.5e3, null]}, \"text\": \"%s\\n\\n\"}\n", n, s > "c.jsonl"
	printf "%s\r\n", $0 > "lines.txt"
	printf "{\"text\": \"%s\"}\n", s > "short.jsonl"
}' "$C"/*.txt
printf 'Caf\303\251 \342\202\254 \360\237\230\200 "q" \\ end\n\n' >> plain.txt
printf '{"text": "Caf\\u00e9 \\u20ac \\ud83d\\ude00 \\"q\\" \\\\ end\\n\\n"}\n' >> c.jsonl
ndocs=$(wc -l < c.jsonl)
[ "$ndocs" -gt 150 ] && pass "corpus_has_documents ($ndocs)" || fail corpus_has_documents "only $ndocs"

# tokenizers: trained on the same documents, the same tokenizer
$A tokenize train -q --vocab 600 -o t.tok --docs blank-line plain.txt
$A tokenize train -q --vocab 600 -o tj.tok --format jsonl c.jsonl
if [ -s t.tok ] && cmp -s t.tok tj.tok; then pass train_jsonl_same_tokenizer; else fail train_jsonl_same_tokenizer "differs"; fi

E=(tokenize encode -q -t t.tok --val-fraction 0.1 --seed 3)
$A "${E[@]}" -o P --docs blank-line plain.txt
$A "${E[@]}" -o J --format jsonl c.jsonl
same jsonl_same_shards P J
zstd -q -k c.jsonl && $A "${E[@]}" -o JZ --format jsonl c.jsonl.zst
same jsonl_zst_same_shards P JZ
gzip -k c.jsonl && $A "${E[@]}" -o JG --format jsonl c.jsonl.gz
same jsonl_gz_same_shards P JG
gzip -k plain.txt && $A "${E[@]}" -o PG --docs blank-line plain.txt.gz
same text_gz_same_shards P PG
# compression by magic, not by name
cp c.jsonl.zst renamed.jsonl && $A "${E[@]}" -o JR --format jsonl renamed.jsonl
same magic_not_suffix P JR
zstd -q -c c.jsonl | $A "${E[@]}" -o JS --format jsonl -
same stdin_zst_same_shards P JS

# a directory of parts, each compressed its own way (sorted by name), and a glob
mkdir parts && split -l 60 c.jsonl parts/part-
gzip parts/part-ab && zstd -q --rm parts/part-ac
$A "${E[@]}" -o D --format jsonl parts
same directory_same_shards P D
$A "${E[@]}" -o G --format jsonl 'parts/part-*'
same glob_same_shards P G

# one document a line, CRLF or not
$A "${E[@]}" -o L --format lines lines.txt
$A "${E[@]}" -o S --format jsonl short.jsonl
same lines_crlf_same_as_jsonl S L

# bad records: named with file and line, counted, never dropped silently
{ head -n 3 c.jsonl; echo '{"text": "cut off'; sed -n 4,10p c.jsonl; echo '{"title": "no text"}'; tail -n +11 c.jsonl; } > bad.jsonl
expect_exit 1 bad_record_stops_by_default -- $A "${E[@]}" -o B0 --format jsonl bad.jsonl
if grep -q "bad.jsonl:4: not valid JSON" err.txt && [ ! -e B0_train.shard ]; then pass bad_record_named;
else fail bad_record_named "$(head -c 300 err.txt)"; fi
expect_exit 0 bad_records_skipped -- $A "${E[@]}" -o B2 --format jsonl --max-bad 2 bad.jsonl
if grep -q 'bad.jsonl:4: ' err.txt && grep -q 'bad.jsonl:12: no member "text"' err.txt &&
	grep -q "2 bad records of $((ndocs + 2)) skipped" err.txt; then pass bad_records_counted;
else fail bad_records_counted "$(head -c 400 err.txt)"; fi
same bad_records_rest_same P B2

# the val split is by document: reversed input, the same documents in val
tac c.jsonl > rev.jsonl
$A "${E[@]}" -o R --format jsonl rev.jsonl
docs_of() { $A tokenize decode -t t.tok --show-eot "$1" | awk 'BEGIN { RS = "<\\|endoftext\\|>" } NF' | sort; }
docs_of J_val.shard > jv.txt; docs_of R_val.shard > rv.txt
docs_of J_train.shard > jt.txt; docs_of R_train.shard > rt.txt
nv=$(grep -c . jv.txt)
if [ "$nv" -gt 0 ] && [ "$nv" -lt "$ndocs" ] && cmp -s jv.txt rv.txt && cmp -s jt.txt rt.txt; then
	pass "val_split_by_document_hash ($nv of $ndocs in val)"
else fail val_split_by_document_hash "val $nv docs; reversed input gives other val documents"; fi
$A "${E[@]}" -o J2 --format jsonl c.jsonl
same val_split_deterministic J J2
$A tokenize encode -q -t t.tok --val-fraction 0.1 --seed 4 -o J4 --format jsonl c.jsonl
if cmp -s J_val.shard J4_val.shard; then fail seed_changes_split "same val shard"; else pass seed_changes_split; fi

# too few documents: split by position, and said so
cat "$C"/*.txt | tr -s '\n' > one.txt # no blank line: one document
$A tokenize encode -t t.tok --val-fraction 0.1 -o one one.txt 2> one.err
total=$($A inspect one_train.shard one_val.shard | awk '/^  tokens/ { s += $2 } END { print s }')
nval=$($A inspect one_val.shard | awk '/^  tokens/ { print $2 }')
want=$(( (total + 5) / 10 ))
if grep -q "1 document is too few to split by document at --val-fraction 0.1" one.err &&
	grep -q "split by position instead: the last $nval of $total tokens" one.err &&
	[ "$nval" -gt 0 ] && [ $((nval - want)) -le 1 ] && [ $((want - nval)) -le 1 ]; then
	pass "position_fallback_said ($nval of $total tokens)"
else fail position_fallback_said "val $nval of $total, want $want: $(head -c 300 one.err)"; fi
$A tokenize decode -t t.tok one_train.shard one_val.shard > back.txt
if cmp -s one.txt back.txt; then pass position_fallback_keeps_order; else fail position_fallback_keeps_order "train+val != input"; fi
# --force keeps the shards it replaces until the new ones are final: a
# split by position that cannot open its files (6 descriptors) leaves them,
# and no staged file behind
before=$(cat one_train.shard one_val.shard | md5sum)
(ulimit -n 6; exec $A tokenize encode -q -t t.tok --val-fraction 0.1 -o one --force one.txt) 2> force.err
rc=$?
if [ $rc -eq 1 ] && [ "$(cat one_train.shard one_val.shard | md5sum)" = "$before" ] &&
   [ -z "$(ls | grep 'one_.*\.pass\.')" ]; then
	pass force_failure_keeps_the_old_shards
else fail force_failure_keeps_the_old_shards "exit $rc, $(ls | grep one_ | tr '\n' ' ') $(head -c 300 force.err)"; fi
# a few documents (fewer than 1/F) also split by position, in input order
head -n 5 c.jsonl > few.jsonl
$A tokenize encode -q -t t.tok --val-fraction 0.1 --seed 3 -o few --format jsonl few.jsonl 2> few.err
$A tokenize encode -q -t t.tok --val-fraction 0 -o fewall --format jsonl few.jsonl
$A tokenize decode -t t.tok few_train.shard few_val.shard > few.txt
$A tokenize decode -t t.tok fewall_train.shard > fewall.txt
if grep -q "5 documents are too few" few.err && [ -s few_val.shard ] && cmp -s few.txt fewall.txt; then
	pass few_documents_by_position
else fail few_documents_by_position "$(head -c 300 few.err)"; fi

# the README's KJV recipe gets a val shard
if command -v bible > /dev/null && bible -f 'Gen1:1-Gen1:2' > /dev/null 2>&1; then
	bible -f 'Gen1:1-Rev22:21' | cut -d' ' -f2- > kjv.txt
	$A tokenize train -q -o kjv.tok kjv.txt
	$A tokenize encode -q -t kjv.tok -o kjv kjv.txt 2> kjv.err
	nval=$($A inspect kjv_val.shard | awk '/^  tokens/ { print $2 }')
	if [ "${nval:-0}" -gt 0 ] && grep -q "split by position" kjv.err; then pass "kjv_recipe_val_shard ($nval tokens)";
	else fail kjv_recipe_val_shard "val shard has ${nval:-no} tokens"; fi
else
	skip kjv_recipe_val_shard "bible-kjv is not installed"
fi

# usage
expect_exit 2 docs_needs_text -- $A tokenize encode -t t.tok --format jsonl --docs blank-line c.jsonl
expect_exit 2 field_needs_jsonl -- $A tokenize encode -t t.tok --field body plain.txt
expect_exit 2 bad_format -- $A tokenize encode -t t.tok --format csv plain.txt
expect_exit 2 negative_max_bad -- $A tokenize encode -t t.tok --format jsonl --max-bad -1 c.jsonl
expect_exit 1 no_glob_match -- $A tokenize encode -t t.tok -o nm 'nothing-*.jsonl'
if grep -q "'nothing-\*.jsonl': no such file, directory or matching files" err.txt; then pass no_glob_match_named;
else fail no_glob_match_named "$(head -c 200 err.txt)"; fi

# the format by the name when --format is not given (issue 31): JSON Lines
# compressed or not, .ndjson and .json, said in the summary; tokenize train too
$A tokenize encode -t t.tok --val-fraction 0.1 --seed 3 -o NZ c.jsonl.zst 2> nz.err
same format_by_name_jsonl_zst J NZ
if grep -q "read c.jsonl.zst as jsonl (by its name; --format FMT sets it)" nz.err; then
	pass format_said_in_summary
else fail format_said_in_summary "$(head -c 300 nz.err)"; fi
cp c.jsonl c.ndjson && gzip -c c.jsonl > c.json.gz
$A "${E[@]}" -o NN c.ndjson && $A "${E[@]}" -o NG c.json.gz
same format_by_name_ndjson J NN
same format_by_name_json_gz J NG
# a JSON Lines dataset folder: its dataset_info.json (one JSON object over
# several lines) and README.md are not corpus, its .jsonl files are
mkdir hfj && cp c.jsonl hfj/train.jsonl && echo '# card' > hfj/README.md &&
	printf '{\n  "description": "x",\n  "features": {}\n}\n' > hfj/dataset_info.json
$A "${E[@]}" -o HJ hfj 2> hj.err
same jsonl_folder_skips_its_json_metadata J HJ
$A tokenize train -q --vocab 600 -o tn.tok c.jsonl.gz
if cmp -s t.tok tn.tok; then pass train_format_by_name; else fail train_format_by_name "differs"; fi
$A tokenize encode -t t.tok --val-fraction 0.1 -o MX c.jsonl.zst plain.txt 2> mx.err
if grep -q "read plain.txt as text, c.jsonl.zst as jsonl (by their names" mx.err; then
	pass formats_of_mixed_inputs_said
else fail formats_of_mixed_inputs_said "$(head -c 300 mx.err)"; fi
# JSON Lines read as text is encoded as it is, but never silently
cp c.jsonl c.txt
$A tokenize encode -q -t t.tok -o JT c.txt 2> jt.err
if grep -q "warning: 'c.txt' is read as text, but its first 5 lines are JSON objects" jt.err &&
	grep -q -- "--format jsonl reads their \"text\" member" jt.err; then
	pass json_read_as_text_warned
else fail json_read_as_text_warned "$(head -c 300 jt.err)"; fi
$A tokenize encode -q -t t.tok --val-fraction 0 -o JT2 plain.txt 2> jt2.err
if [ ! -s jt2.err ]; then pass text_not_warned; else fail text_not_warned "$(head -c 300 jt2.err)"; fi
# a .json holding one JSON array is refused, naming the conversion
printf '[\n  {"text": "a"},\n  {"text": "b"}\n]\n' > arr.json
expect_exit 1 json_array_refused -- $A tokenize encode -q -t t.tok -o AR arr.json
if grep -q "arr.json:1: a JSON array, not JSON Lines (one object a line): convert it with: jq -c '.\[\]' arr.json > arr.jsonl" err.txt &&
	[ ! -e AR_train.shard ]; then pass json_array_named
else fail json_array_named "$(head -c 300 err.txt)"; fi

# empty inputs (issue 31, 32): a warning, and the summary says which shards
: > empty.jsonl
expect_exit 0 empty_input_encodes -- $A tokenize encode -t t.tok -o EM empty.jsonl
if grep -q "warning: the input holds no documents: EM_train.shard and EM_val.shard are empty" err.txt; then
	pass empty_input_warned
else fail empty_input_warned "$(head -c 300 err.txt)"; fi
$A tokenize encode -t t.tok --val-fraction 0 -o V0 plain.txt 2> v0.err
if grep -q "V0_train.shard: [0-9]* tokens, no val shard at --val-fraction 0 (" v0.err && [ ! -e V0_val.shard ]; then
	pass val_fraction_0_said
else fail val_fraction_0_said "$(head -c 300 v0.err)"; fi
# ... and a val shard of an earlier encode under that prefix, which it does
# not replace, is named as not this input's
$A tokenize encode -q -t t.tok -o V0 --force plain.txt 2> /dev/null
$A tokenize encode -t t.tok --val-fraction 0 -o V0 --force c.jsonl 2> v0.err
if grep -q "warning: 'V0_val.shard' is left from before" v0.err && [ -s V0_val.shard ]; then
	pass val_fraction_0_names_an_old_val_shard
else fail val_fraction_0_names_an_old_val_shard "$(head -c 300 v0.err)"; fi

# a write failure names the shard, not the file it is staged in (issue 32)
(ulimit -f 1; trap '' XFSZ; exec $A tokenize encode -q -t t.tok --val-fraction 0.1 -o WF c.jsonl) 2> wf.err
if grep -q "cannot write 'WF_train.shard': File too large" wf.err && ! grep -q 'pass\.' wf.err &&
	[ -z "$(ls | grep '^WF_')" ]; then pass write_failure_names_the_shard
else fail write_failure_names_the_shard "$(head -c 300 wf.err); $(ls | grep '^WF_' | tr '\n' ' ')"; fi
