#!/usr/bin/env bash
# tokenizer_roundtrip.sh - tokenize train/encode/decode through the CLI:
# decode(encode(FILES)) == cat FILES for text and random bytes, in both
# document modes, from stdin, across threads; the train/val split.
. "$ROOT/tests/lib.sh"
A=$ASYNCPP
C=$TESTDATA/corpus

expect_exit 0 train -- $A tokenize train -q --vocab 600 -o t.tok $C/*.txt
expect_exit 0 train_again -- $A tokenize train -q --vocab 600 -o t2.tok $C/*.txt
if cmp -s t.tok t2.tok; then pass train_deterministic; else fail train_deterministic "two runs differ"; fi

# text, one document per file
$A tokenize encode -q -t t.tok -o txt --val-fraction 0 $C/*.txt &&
	$A tokenize decode -t t.tok txt_train.shard > back.txt
if cat $C/*.txt | cmp -s - back.txt; then pass roundtrip_files; else fail roundtrip_files "decoded text differs"; fi

# random bytes (invalid UTF-8 included), blank-line documents, 1 and 2 threads
head -c 300000 /dev/urandom > rand.bin
printf 'a\n\n\nb \n \r\n\nc\n\n' >> rand.bin
for j in 1 2; do
	$A tokenize encode -q -t t.tok -o r$j -j $j --val-fraction 0 --docs blank-line rand.bin &&
		$A tokenize decode -t t.tok -o back$j.bin r${j}_train.shard
	if cmp -s rand.bin back$j.bin; then pass roundtrip_bytes_j$j; else fail roundtrip_bytes_j$j "decoded bytes differ"; fi
done
if cmp -s r1_train.shard r2_train.shard; then pass threads_same_shard; else fail threads_same_shard "shards differ between -j 1 and -j 2"; fi

# a large single document is cut into pieces for the threads: same ids
for i in 1 2 3 4 5 6 7 8; do cat $C/*.txt; done > big.txt
$A tokenize encode -t t.tok --ids -j 1 big.txt > ids1.txt
$A tokenize encode -t t.tok --ids -j 2 big.txt > ids2.txt
if cmp -s ids1.txt ids2.txt && [ -s ids1.txt ]; then pass big_doc_threads; else fail big_doc_threads "ids differ"; fi

# stdin; empty input
cat $C/sea.txt | $A tokenize encode -q -t t.tok -o in --val-fraction 0 - &&
	$A tokenize decode -t t.tok in_train.shard > in.txt
if cmp -s $C/sea.txt in.txt; then pass roundtrip_stdin; else fail roundtrip_stdin "differs"; fi
: > empty.txt
$A tokenize encode -q -t t.tok -o e --val-fraction 0 empty.txt && $A tokenize decode -t t.tok e_train.shard > e.txt
if [ -f e_train.shard ] && [ ! -s e.txt ]; then pass empty_input; else fail empty_input "no shard or output"; fi

# train/val split: every document lands in exactly one shard, deterministically
$A tokenize encode -q -t t.tok -o s --val-fraction 0.3 --seed 5 --docs blank-line $C/*.txt
$A tokenize encode -q -t t.tok -o s2 --val-fraction 0.3 --seed 5 --docs blank-line $C/*.txt
$A tokenize decode -t t.tok --show-eot s_train.shard > st.txt
$A tokenize decode -t t.tok --show-eot s_val.shard > sv.txt
nall=$($A tokenize encode -t t.tok --ids --docs blank-line $C/*.txt | wc -l)
nt=$(grep -o '<|endoftext|>' st.txt | wc -l)
nv=$(grep -o '<|endoftext|>' sv.txt | wc -l)
if [ "$nt" -gt 0 ] && [ "$nv" -gt 0 ] && [ $((nt + nv)) -eq "$nall" ]; then pass val_split;
else fail val_split "train $nt + val $nv documents, expected $nall"; fi
if cmp -s s_val.shard s2_val.shard; then pass val_split_deterministic; else fail val_split_deterministic "differs"; fi

# errors
expect_exit 2 bad_docs -- $A tokenize encode -t t.tok --docs lines x.txt
expect_exit 2 no_tokenizer -- $A tokenize encode x.txt
expect_exit 1 missing_file -- $A tokenize encode -t t.tok -o m nonexistent.txt
if [ ! -e m_train.shard ]; then pass no_partial_shard; else fail no_partial_shard "shard left behind"; fi
head -c 100 t.tok > cut.tok
expect_exit 1 truncated_tokenizer -- $A tokenize encode -t cut.tok $C/sea.txt
$A tokenize train -q --vocab 300 -o other.tok $C/sea.txt
expect_exit 1 wrong_tokenizer -- $A tokenize decode -t other.tok txt_train.shard
