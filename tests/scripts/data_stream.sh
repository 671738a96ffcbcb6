#!/usr/bin/env bash
# data_stream.sh - data.load=stream gives the run data.load=memory gives
# (one worker and a 2BW pipeline, eleven shards), eval agrees, and a shard
# damaged inside a chunk is refused at open in memory and stops a streamed
# run with the file named and no checkpoint written.
. "$ROOT/tests/lib.sh"
A=$ASYNCPP

# eleven train shards (one per corpus file) and one val shard
$A tokenize train -q --vocab 400 -o t.tok "$ROOT"/testdata/corpus/*.txt
mkdir -p shards
for f in "$ROOT"/testdata/corpus/*.txt; do
	$A tokenize encode -q -t t.tok -o "shards/$(basename "$f" .txt)" --val-fraction 0 "$f"
done
$A tokenize encode -q -t t.tok -o val --val-fraction 0 "$ROOT"/testdata/corpus/sea.txt
RUN=(--set data.train=shards --set data.val=val_train.shard --set data.tokenizer=t.tok
     --set model.n_layer=2 --set model.d_model=32 --set model.n_head=2 --set model.seq_len=32
     --set train.batch_size=4 --set train.steps=30 --set log.every=1 --set eval.every=10
     --set train.threads=1)

# same_losses NAME DIR1 DIR2: metrics.csv steps, losses, val losses and norms equal
same_losses() {
	if [ -s "$2/metrics.csv" ] && [ "$(wc -l < "$2/metrics.csv")" -gt 30 ] &&
	   cmp -s <(cut -d, -f1,4,5,7 "$2/metrics.csv") <(cut -d, -f1,4,5,7 "$3/metrics.csv"); then
		pass "$1"
	else
		fail "$1" "$(diff <(cut -d, -f1,4,5,7 "$2/metrics.csv") <(cut -d, -f1,4,5,7 "$3/metrics.csv") | head -n 4 | tr '\n' ' ')"
	fi
}

for sched in none 2bw; do
	P=()
	[ $sched = 2bw ] && P=(--set train.schedule=2bw --set pipeline.stages=2 --set pipeline.micro_batches=2)
	ok=1
	for load in memory stream; do
		$A train -q "${RUN[@]}" "${P[@]}" --set data.load=$load --set train.out_dir=$sched-$load 2> err.txt ||
			{ fail "stream_equals_memory_$sched" "$load: $(cat err.txt)"; ok=0; }
	done
	[ $ok = 1 ] && same_losses "stream_equals_memory_$sched" $sched-memory $sched-stream
done

# eval of the streamed run's checkpoint (it streams too: data.load is in its config)
if $A eval none-stream > e1.txt 2> err.txt && $A eval none-memory > e2.txt 2>> err.txt &&
   [ "$(grep '^loss' e1.txt)" = "$(grep '^loss' e2.txt)" ] && grep -q '^loss' e1.txt; then
	pass eval_stream_equals_memory
else
	fail eval_stream_equals_memory "$(cat err.txt e1.txt e2.txt | tr '\n' ' ')"
fi

# a shard damaged in its chunk: flip bytes in the middle (the header frame
# at the start and the seek table at the end stay intact)
cp -r shards damaged
size=$(wc -c < damaged/kitchen_train.shard)
head -c $((size / 6)) /dev/zero | tr '\0' 'Z' |
	dd of=damaged/kitchen_train.shard bs=1 seek=$((size / 3)) conv=notrunc 2> /dev/null
DMG=("${RUN[@]}" --set data.train=damaged --set eval.every=0)
expect_exit 1 damaged_refused_in_memory -- $A train -q "${DMG[@]}" --set data.load=memory --set train.out_dir=dm
grep -q 'kitchen_train.shard' err.txt && pass damaged_named_in_memory || fail damaged_named_in_memory "$(cat err.txt)"
expect_exit 1 damaged_stops_stream -- $A train -q "${DMG[@]}" --set data.load=stream --set train.out_dir=ds
if grep -q 'kitchen_train.shard' err.txt && grep -q 'reading the data failed' err.txt &&
   [ -z "$(ls ds/*.ckpt 2> /dev/null)" ]; then
	pass damaged_stream_named_nothing_saved
else
	fail damaged_stream_named_nothing_saved "$(ls ds; cat err.txt)"
fi
