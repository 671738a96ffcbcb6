#!/usr/bin/env bash
# train_report.sh - what train and inspect tell the user (issue 31): the
# start line names its factors, a run that will memorise its data says so,
# metrics.csv records each step's own time (also within a pipeline segment
# logged at once), and inspect --diff gives its verdict first and lists the
# identical tensors only with -v.
. "$ROOT/tests/lib.sh"
A=$ASYNCPP
TINY=(--set model.n_layer=1 --set model.d_model=32 --set model.n_head=2 --set model.seq_len=32
      --set train.batch_size=4 --set eval.every=0 --set train.threads=1)

# 1. the start line: "N steps of M micro-batches x B sequences x T tokens"
if $A train "${TINY[@]}" --set train.out_dir=start --set train.steps=2 \
	--set pipeline.micro_batches=2 2> err.txt &&
   grep -q '^asyncpp: training .*, 2 steps of 2 micro-batches x 4 sequences x 32 tokens$' err.txt
then
	pass start_line_names_factors
else
	fail start_line_names_factors "$(grep 'training' err.txt | head -c 300)"
fi
DATA=(--set data.train=start/data/builtin_train.shard --set data.val=)

# 2. fewer training tokens than parameters, or more than 10 passes: one
# warning line naming both numbers; none for a run that is neither
if grep -Eq '^asyncpp: warning: data.train holds [0-9.]+ k tokens for [0-9.]+ k parameters, .*\(0.0 passes\): fewer tokens than parameters' err.txt &&
   [ "$(grep -c warning err.txt)" = 1 ]; then
	pass warn_fewer_tokens_than_parameters
else
	fail warn_fewer_tokens_than_parameters "$(head -c 400 err.txt)"
fi
SMALL=(--set model.n_layer=1 --set model.d_model=8 --set model.n_head=1 --set eval.every=0
       --set train.threads=1 --set model.seq_len=128)
if $A train "${SMALL[@]}" "${DATA[@]}" --set train.out_dir=passes --set train.steps=40 \
	--set train.batch_size=64 2> err.txt &&
   grep -Eq '^asyncpp: warning: data.train holds [0-9.]+ k tokens for [0-9]+ parameters, and train.steps = 40 reads 328 k tokens \(1[0-9].[0-9] passes\): more than 10 passes over the data' err.txt
then
	pass warn_many_passes
else
	fail warn_many_passes "$(head -c 400 err.txt)"
fi
if $A train "${SMALL[@]}" "${DATA[@]}" --set train.out_dir=fine --set train.steps=3 \
	--set train.batch_size=64 2> err.txt && ! grep -q warning err.txt; then
	pass no_warning_for_a_fitting_run
else
	fail no_warning_for_a_fitting_run "$(head -c 400 err.txt)"
fi

# 3. wall_s is each step's own time: it grows from step to step, also for the
# steps of one pipeline segment (logged together when the segment ends) and
# between log lines of one worker
increasing() { # METRICS: the step rows' wall_s strictly increase
	awk -F, 'NR > 1 && $4 != "" { if (n++ && $3 <= last) bad = 1; last = $3 }
		 END { exit bad || n < 2 }' "$1"
}
if $A train -q "${TINY[@]}" "${DATA[@]}" --set train.out_dir=seg --set train.steps=6 \
	--set log.every=1 --set train.schedule=2bw --set pipeline.stages=1 \
	--set pipeline.micro_batches=2 2> err.txt && increasing seg/metrics.csv; then
	pass wall_s_per_step_in_a_segment
else
	fail wall_s_per_step_in_a_segment "$(cut -d, -f1-4 seg/metrics.csv | tr '\n' ' ' | head -c 300) $(head -c 200 err.txt)"
fi
if $A train -q "${TINY[@]}" "${DATA[@]}" --set train.out_dir=one --set train.steps=6 \
	--set log.every=6 2> err.txt && increasing one/metrics.csv; then
	pass wall_s_per_step_between_log_lines
else
	fail wall_s_per_step_between_log_lines "$(cut -d, -f1-4 one/metrics.csv | tr '\n' ' ' | head -c 300)"
fi

# 4. inspect --diff: the verdict first; identical tensors listed only with -v.
# Step 0 against 2 steps at lr 0: the same weights, other AdamW moments.
$A train -q "${TINY[@]}" "${DATA[@]}" --set train.out_dir=z0 --set train.steps=0 2> err.txt
$A train -q "${TINY[@]}" "${DATA[@]}" --set train.out_dir=z2 --set train.steps=2 \
	--set optim.lr=0 2>> err.txt
z0=z0/ckpt-00000000.ckpt z2=z2/ckpt-00000002.ckpt
if $A inspect --diff $z0 $z2 > d.txt 2>> err.txt &&
   head -n 1 d.txt | grep -Eq '^different: ([0-9]+) of ([0-9]+) compared tensors differ, 0 not comparable$' &&
   grep -q '^adam_m/' d.txt && ! grep -q '^weights' d.txt; then
	pass inspect_diff_verdict_first_differing_only
else
	fail inspect_diff_verdict_first_differing_only "$(head -c 400 d.txt) $(head -c 200 err.txt)"
fi
if $A inspect --diff -v $z0 $z2 > dv.txt 2>> err.txt &&
   grep -Eq '^weights\.v0/wte +0 +0  identical$' dv.txt &&
   [ "$(grep -c '^weights\.v0/.*identical$' dv.txt)" = "$(grep -c '^weights\.v0/' dv.txt)" ]; then
	pass inspect_diff_verbose_lists_identical
else
	fail inspect_diff_verbose_lists_identical "$(head -c 600 dv.txt)"
fi
if $A inspect --diff $z2 $z2 > same.txt 2>> err.txt &&
   head -n 1 same.txt | grep -Eq '^identical: all [0-9]+ tensors have the same bits$' &&
   ! grep -q 'differences' same.txt; then
	pass inspect_diff_identical_verdict
else
	fail inspect_diff_identical_verdict "$(head -c 300 same.txt)"
fi
