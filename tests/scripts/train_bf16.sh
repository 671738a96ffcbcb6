#!/usr/bin/env bash
# train_bf16.sh - train.act_dtype = bf16 from the command line: the built-in
# default trains (the loss falls), starts where f32 starts (closely, not
# bit for bit), eval and sample read its checkpoint, and a bf16 pipeline
# (2bw, S = 2) gives the losses of one worker with delay = 1, bit for bit.
. "$ROOT/tests/lib.sh"
A=$ASYNCPP
Q=(--set log.every=5 --set eval.every=0 --set train.threads=2)

# 1. the built-in default trains in bf16
if $A train -q "${Q[@]}" --set train.act_dtype=bf16 --set train.steps=30 \
	--set train.out_dir=bf 2> err.txt; then
	first=$(sed -n 2p bf/metrics.csv | cut -d, -f4)
	last=$(grep -v ',,,,' bf/metrics.csv | tail -n 1 | cut -d, -f4)
	if awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.3) }'; then
		pass "bf16_loss_falls ($first -> $last)"
	else
		fail bf16_loss_falls "first $first, last $last"
	fi
else
	fail bf16_loss_falls "train failed: $(cat err.txt)"
fi
DATA=(--set data.train=bf/data/builtin_train.shard --set data.val=bf/data/builtin_val.shard
      --set data.tokenizer=bf/data/builtin.tok)

# 2. the first step's loss is f32's, up to bf16 rounding
if $A train -q "${Q[@]}" "${DATA[@]}" --set train.steps=1 --set train.out_dir=f32 2> err.txt; then
	a=$(sed -n 2p f32/metrics.csv | cut -d, -f4)
	b=$(sed -n 2p bf/metrics.csv | cut -d, -f4)
	if [ "$a" != "$b" ] && awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; exit !(d < 0.01 && d > -0.01) }'; then
		pass "bf16_first_loss_near_f32 ($a, $b)"
	else
		fail bf16_first_loss_near_f32 "f32 $a, bf16 $b"
	fi
else
	fail bf16_first_loss_near_f32 "train failed: $(cat err.txt)"
fi

# 3. eval and sample read the bf16 run's checkpoint
if $A eval bf > eval.txt 2> err.txt && grep -q '^perplexity' eval.txt &&
   $A sample bf --prompt "The" -n 10 --seed 3 > s.txt 2>> err.txt && [ -s s.txt ]; then
	pass bf16_eval_and_sample
else
	fail bf16_eval_and_sample "$(cat err.txt)"
fi

# 4. a bf16 pipeline is one worker with delay 1, bit for bit
T=(--set model.n_layer=2 --set model.d_model=32 --set model.n_head=2 --set model.seq_len=32
   --set train.batch_size=2 --set pipeline.micro_batches=2 --set train.steps=8
   --set train.act_dtype=bf16 --set log.every=1)
if $A train -q "${Q[@]}" "${DATA[@]}" "${T[@]}" --set train.delay=1 --set train.out_dir=d1 2> err.txt &&
   $A train -q "${Q[@]}" "${DATA[@]}" "${T[@]}" --set train.schedule=2bw --set pipeline.stages=2 \
	--set train.out_dir=bw 2>> err.txt; then
	cut -d, -f1,4 d1/metrics.csv > l1.txt
	cut -d, -f1,4 bw/metrics.csv > l2.txt
	if cmp -s l1.txt l2.txt && [ "$(wc -l < l1.txt)" -ge 9 ]; then
		pass bf16_2bw_equals_delay_one
	else
		fail bf16_2bw_equals_delay_one "$(paste -d' ' l1.txt l2.txt | head -5 | tr '\n' ' ')"
	fi
else
	fail bf16_2bw_equals_delay_one "train failed: $(cat err.txt)"
fi
