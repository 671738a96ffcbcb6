#!/usr/bin/env bash
# tokenize_parquet.sh - Parquet corpora (io/text/parquet.h) as Hugging
# Face datasets ship them: files from independent writers (testdata/parquet,
# most made by tests/parquet_fixtures.mjs: data pages v1 and v2; snappy,
# gzip, zstd and none; dictionary, plain and delta-encoded values; nulls,
# empty strings, other columns, many row groups and pages) give exactly the
# documents of the same rows as JSON Lines; bad input is refused by name.
. "$ROOT/tests/lib.sh"
A=$ASYNCPP
P=$TESTDATA/parquet

$A tokenize train -q --vocab 400 -o t.tok --format jsonl "$P/docs.jsonl" ||
	{ fail parquet_setup "tokenize train failed"; exit 0; }

# FIXTURE EXPECTED: the token ids of both reads are identical
same_ids() {
	local name=$1 want=$2
	if ! $A tokenize encode -t t.tok --ids --format parquet "$P/$name.parquet" > got.ids 2> got.err; then
		fail "parquet_$name" "$(head -c 300 got.err)"
		return
	fi
	$A tokenize encode -t t.tok --ids --format jsonl "$P/$want.jsonl" > want.ids 2> /dev/null
	if [ -s want.ids ] && cmp -s got.ids want.ids; then
		pass "parquet_${name}_equals_its_jsonl ($(wc -l < got.ids) documents)"
	else
		fail "parquet_$name" "ids differ from $want.jsonl's: $(wc -l < got.ids) vs $(wc -l < want.ids) documents"
	fi
}
same_ids v2_snappy docs
same_ids v2_zstd docs
same_ids v2_gzip_nulls v2_gzip_nulls
same_ids v2_dictionary v2_dictionary
same_ids v1_snappy_nulls v1_snappy_nulls
same_ids v1_gzip docs
same_ids v1_plain docs
same_ids v2_delta_length_nulls v2_gzip_nulls
same_ids v2_delta_prefixes v2_delta_prefixes
# a 100 KB string 2800 times, prefix-encoded in one page: read one string at
# a time, never the page's 280 MB at once
printf '{"text": "%s"}\n' "$(printf 'word %.0s' $(seq 20000))" > long.jsonl
$A tokenize encode -t t.tok --ids --format jsonl long.jsonl > long.ids 2> /dev/null
$A tokenize encode -t t.tok --ids --format parquet "$P/v2_delta_repeats.parquet" > rep.ids 2> rep.err
if [ "$(wc -l < rep.ids)" = 2800 ] && [ "$(sort -u rep.ids | wc -l)" = 1 ] &&
   cmp -s <(head -n 1 rep.ids) long.ids; then
	pass parquet_delta_repeats_rebuilt_one_at_a_time
else fail parquet_delta_repeats_rebuilt_one_at_a_time "$(wc -l < rep.ids) lines: $(head -c 300 rep.err)"; fi
# layouts of other writers, from a writer that imitates them (a review's):
# pages of nulls only, with no values area (parquet-java's v2) or no
# dictionary indices (v1), and pyarrow's empty table (a row group of 0
# rows whose data page offset is 0)
same_ids v2_null_pages_no_values null_pages
same_ids v1_null_pages_no_indices null_pages
if $A tokenize encode -t t.tok --ids --format parquet "$P/arrow_empty_table.parquet" > got.ids 2> got.err &&
   [ ! -s got.ids ]; then
	pass parquet_empty_table_is_no_documents
else fail parquet_empty_table_is_no_documents "$(head -c 300 got.err)"; fi

# nulls and empty strings are counted and said, never silent
$A tokenize encode -t t.tok --ids --format parquet "$P/v2_gzip_nulls.parquet" > /dev/null 2> err.txt
nulls=$(grep -c '^{"text":""}$' "$P/v2_gzip_nulls.jsonl")
if grep -q "^asyncpp: $nulls rows with an empty or null \"text\" (no document)" err.txt; then
	pass "parquet_nulls_counted ($nulls)"
else fail parquet_nulls_counted "expected $nulls: $(cat err.txt)"; fi

# shards, and a tokenizer trained on Parquet, as from the same JSON Lines
$A tokenize encode -q -t t.tok -o pq --format parquet "$P/v2_snappy.parquet" "$P/v1_gzip.parquet"
$A tokenize encode -q -t t.tok -o js --format jsonl "$P/docs.jsonl" "$P/docs.jsonl"
$A tokenize train -q --vocab 400 -o tp.tok --format parquet "$P/v2_zstd.parquet"
if cmp -s pq_train.shard js_train.shard && cmp -s pq_val.shard js_val.shard && cmp -s t.tok tp.tok; then
	pass parquet_shards_and_tokenizer_equal_jsonl
else fail parquet_shards_and_tokenizer_equal_jsonl "shards or tokenizer differ"; fi

# a dataset folder as downloaded: its Parquet shards are read (sorted),
# its README and other files are not corpus
mkdir -p ds/data && printf -- '---\nlicense: mit\n---\n# a dataset\n' > ds/README.md
cp "$P/v2_snappy.parquet" ds/data/train-00000.parquet
cp "$P/v1_gzip.parquet" ds/data/train-00001.parquet
echo '{}' > ds/data/dataset_info.json
$A tokenize encode -t t.tok --ids --format parquet ds > got.ids 2> got.err
cat "$P/docs.jsonl" "$P/docs.jsonl" > twice.jsonl
$A tokenize encode -t t.tok --ids --format jsonl twice.jsonl > want.ids 2> /dev/null
if cmp -s got.ids want.ids; then pass parquet_dataset_folder_reads_its_shards
else fail parquet_dataset_folder_reads_its_shards "$(head -c 300 got.err)"; fi
# the same without --format: the folder's Parquet files by their names only
$A tokenize encode -t t.tok --ids ds > got.ids 2> got.err
if cmp -s got.ids want.ids && grep -q "read 2 files as parquet (by their names" got.err; then
	pass dataset_folder_by_name_reads_its_shards
else fail dataset_folder_by_name_reads_its_shards "$(head -c 300 got.err)"; fi
mkdir -p nods && echo text > nods/a.txt
expect_exit 1 parquet_folder_without_shards -- \
	$A tokenize encode -t t.tok --ids --format parquet nods
grep -q "'nods': no .parquet files in this directory" err.txt ||
	fail parquet_folder_without_shards_message "$(cat err.txt)"

# refusals, each naming the file and the way out
expect_fail() { # NAME PATTERN -- CMD...
	local name=$1 pattern=$2
	shift 3
	"$@" > /dev/null 2> err.txt
	local rc=$?
	if [ $rc -eq 1 ] && grep -q -- "$pattern" err.txt; then pass "$name"; else
		fail "$name" "exit $rc: $(head -c 300 err.txt)"; fi
}
expect_fail parquet_no_such_column "no top-level column 'content'; its string columns are text, url (choose the text column with --field)" -- \
	$A tokenize encode -t t.tok --ids --format parquet --field content "$P/v2_snappy.parquet"
expect_fail parquet_column_not_strings "column 'id' does not hold strings" -- \
	$A tokenize encode -t t.tok --ids --format parquet --field id "$P/v2_snappy.parquet"
expect_fail parquet_given_as_text "v2_snappy.parquet' is a Parquet file: read it with --format parquet" -- \
	$A tokenize encode -t t.tok --ids --format text "$P/v2_snappy.parquet"
# without --format a Parquet file is read as one by its magic, whatever its name
cp "$P/v2_snappy.parquet" data.bin
$A tokenize encode -t t.tok --ids --format parquet "$P/v2_snappy.parquet" > want.ids 2> /dev/null
if $A tokenize encode -t t.tok --ids data.bin > got.ids 2> got.err && cmp -s want.ids got.ids &&
	grep -q "read data.bin as parquet" got.err; then pass parquet_by_magic_without_format
else fail parquet_by_magic_without_format "$(head -c 300 got.err)"; fi
expect_fail parquet_not_parquet "docs.jsonl': not a Parquet file (no PAR1 magic" -- \
	$A tokenize encode -t t.tok --ids --format parquet "$P/docs.jsonl"
expect_fail parquet_from_stdin "standard input cannot be read as Parquet" -- \
	$A tokenize encode -t t.tok --ids --format parquet -
head -c 3000 "$P/v1_gzip.parquet" > cut.parquet
expect_fail parquet_truncated "cut.parquet': not a Parquet file" -- \
	$A tokenize encode -t t.tok --ids --format parquet cut.parquet
# a damaged page: bytes flipped inside the first column chunk's data
cp "$P/v1_gzip.parquet" bad.parquet
printf '\377\377\377\377\377\377\377\377' | dd of=bad.parquet bs=1 seek=200 conv=notrunc 2> /dev/null
expect_fail parquet_damaged_page "bad.parquet': column 'text'" -- \
	$A tokenize encode -t t.tok --ids --format parquet bad.parquet
