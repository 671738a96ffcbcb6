#!/usr/bin/env bash
# train_cli.sh - asyncpp train/eval/sample/inspect end to end on the
# built-in corpus, with a tiny model: the loss falls, NaN stops the run,
# SIGTERM checkpoints and the run resumes exactly, corruption is rejected.
. "$ROOT/tests/lib.sh"
A=$ASYNCPP
TINY=(--set model.n_layer=2 --set model.d_model=32 --set model.n_head=2 --set model.seq_len=32
      --set train.batch_size=4 --set log.every=5 --set eval.every=0 --set train.threads=1)

# 1. the loss falls on the built-in corpus
if $A train -q "${TINY[@]}" --set train.out_dir=base --set train.steps=60 --set optim.lr=1e-2 2> err.txt; then
	first=$(sed -n 2p base/metrics.csv | cut -d, -f4)
	last=$(grep -v ',,,,' base/metrics.csv | tail -n 1 | cut -d, -f4)
	if awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.5) }'; then
		pass "loss_falls ($first -> $last)"
	else
		fail loss_falls "first $first, last $last"
	fi
else
	fail loss_falls "train failed: $(cat err.txt)"
fi
DATA=(--set data.train=base/data/builtin_train.shard --set data.val=base/data/builtin_val.shard
      --set data.tokenizer=base/data/builtin.tok)

# 2. eval and sample work on the result
if $A eval base > eval.txt 2> err.txt && grep -q '^perplexity' eval.txt; then pass eval; else fail eval "$(cat err.txt)"; fi
if $A sample base --prompt "The" -n 20 --seed 3 > s1.txt 2> err.txt &&
   $A sample base --prompt "The" -n 20 --seed 3 > s2.txt && cmp -s s1.txt s2.txt && [ -s s1.txt ]; then
	pass sample_is_deterministic_per_seed
else
	fail sample_is_deterministic_per_seed "$(cat err.txt)"
fi

# 3. a diverging run skips the steps whose gradient norm is not finite, stops
# after train.max_skipped of them in a row naming the steps, never writes a
# checkpoint with NaN in it, and never deletes the newest good one (issue
# 12's case: lr 30, a checkpoint every step, keep 1)
$A train -q "${TINY[@]}" "${DATA[@]}" --set train.out_dir=nan --set train.steps=50 \
	--set optim.lr=30 --set optim.warmup=0 --set checkpoint.every=1 --set checkpoint.keep=1 \
	--set train.max_skipped=3 2> err.txt
rc=$?
if [ $rc -eq 1 ] && grep -Eq "update skipped \(1 of train.max_skipped = 3" err.txt &&
	grep -Eq "training diverged: .* for 3 steps in a row \(steps [0-9]+ to [0-9]+\)" err.txt; then
	pass nan_steps_skipped_then_stop
else
	fail nan_steps_skipped_then_stop "exit $rc: $(cat err.txt)"
fi
# the skipped column marks every skipped step, the last three in a row
skips=$(awk -F, 'NR > 1 {print $11}' nan/metrics.csv | tr -d '\n')
if [[ "$skips" == *111 ]] && [ "$(tr -cd 1 <<< "$skips" | wc -c)" -eq "$(grep -c 'update skipped' err.txt)" ]; then
	pass skipped_column_marks_them
else
	fail skipped_column_marks_them "skipped column '$skips'"
fi
# the one checkpoint kept is the last step before the final run of skips,
# clean, and eval reads it
last_ok=$(awk -F, 'NR > 1 && $11 == 0 {s = $1} END {print s}' nan/metrics.csv)
ck=$(ls nan/ckpt-*.ckpt 2> /dev/null)
if [ "$ck" = "$(printf 'nan/ckpt-%08d.ckpt' "$last_ok")" ] && $A inspect $ck > insp.txt 2> err.txt &&
	! grep -q NON-FINITE insp.txt && $A eval $ck > ev.txt 2> err.txt; then
	pass newest_good_checkpoint_kept
else
	fail newest_good_checkpoint_kept "checkpoints '$ck', last update at step $last_ok: $(cat err.txt)"
fi

# 4. SIGTERM writes a checkpoint; resuming gives exactly the uninterrupted
# losses, one row per step (no duplicates), on one worker and on a 2BW pipeline
sigterm_case() {
	local name=$1; shift
	local RUN=("${TINY[@]}" "${DATA[@]}" --set train.steps=300 --set log.every=1 "$@")
	if ! $A train -q "${RUN[@]}" --set train.out_dir=full_$name 2> err.txt; then
		fail "sigterm_$name" "full run: $(cat err.txt)"
		return
	fi
	$A train -q "${RUN[@]}" --set train.out_dir=killed_$name 2> killed.err &
	local pid=$!
	for _ in $(seq 1 400); do
		[ -f killed_$name/metrics.csv ] && [ "$(wc -l < killed_$name/metrics.csv)" -gt 2 ] && break
		sleep 0.05
	done
	kill -TERM $pid
	wait $pid
	local rc=$?
	local ck
	ck=$(ls killed_$name/ckpt-*.ckpt 2> /dev/null | tail -n 1)
	if [ $rc -ne 143 ] || [ -z "$ck" ]; then
		fail "sigterm_${name}_writes_checkpoint" "exit $rc, checkpoint '$ck': $(cat killed.err)"
		return
	fi
	pass "sigterm_${name}_writes_checkpoint"
	if ! $A train -q --resume killed_$name 2> err.txt; then
		fail "sigterm_${name}_resume_is_exact" "resume failed: $(cat err.txt)"
		return
	fi
	# every step's loss of the resumed run equals the uninterrupted one
	if diff <(cut -d, -f1,4 full_$name/metrics.csv | grep -v ',$') \
		<(cut -d, -f1,4 killed_$name/metrics.csv | grep -v ',$') > d.txt; then
		pass "sigterm_${name}_resume_is_exact"
	else
		fail "sigterm_${name}_resume_is_exact" "$(head -n 4 d.txt | tr '\n' ' ')"
	fi
}
sigterm_case delay --set train.delay=1 --set optim.correction=ef
sigterm_case 2bw --set train.schedule=2bw --set pipeline.stages=2 --set pipeline.micro_batches=2

# 5. an earlier run's checkpoints are not overwritten by accident
$A train -q "${TINY[@]}" "${DATA[@]}" --set train.out_dir=base --set train.steps=5 2> err.txt
rc=$?
if [ $rc -eq 1 ] && grep -q -- "--resume" err.txt; then pass refuses_to_overwrite; else fail refuses_to_overwrite "exit $rc"; fi

# 6. inspect shows the checkpoint; a flipped byte is rejected by inspect, eval and resume
ck=$(ls base/ckpt-*.ckpt | tail -n 1)
if $A inspect "$ck" > insp.txt && grep -q 'weights.v0/wte' insp.txt && grep -q 'adam_m/' insp.txt; then
	pass inspect_checkpoint
else
	fail inspect_checkpoint "$(head -c 300 insp.txt)"
fi
cp "$ck" bad.ckpt
size=$(stat -c %s bad.ckpt)
printf '\x55' | dd of=bad.ckpt bs=1 seek=$((size / 2)) conv=notrunc 2> /dev/null
for cmd in "inspect bad.ckpt" "eval bad.ckpt" "train --resume bad.ckpt"; do
	$A $cmd > /dev/null 2> err.txt
	rc=$?
	if [ $rc -eq 1 ] && grep -q "bad.ckpt" err.txt; then
		pass "corrupt_checkpoint_rejected_by_${cmd%% *}"
	else
		fail "corrupt_checkpoint_rejected_by_${cmd%% *}" "exit $rc: $(cat err.txt)"
	fi
done
if $A inspect --diff "$ck" full_delay/$(ls full_delay | grep ckpt | tail -n 1) > diff.txt 2> err.txt && grep -q "largest differences" diff.txt; then
	pass inspect_diff
else
	fail inspect_diff "$(cat err.txt diff.txt | head -c 300)"
fi

# 7. a resumed run cannot change the model or the data order
$A train -q --resume base --set model.n_layer=1 > /dev/null 2> err.txt
rc=$?
if [ $rc -eq 1 ] && grep -q "model.n_layer" err.txt; then pass resume_refuses_model_change; else fail resume_refuses_model_change "exit $rc: $(cat err.txt)"; fi
$A train -q --resume base --set train.batch_size=3 > /dev/null 2> err.txt
rc=$?
if [ $rc -eq 1 ] && grep -q "train.batch_size" err.txt; then pass resume_refuses_data_order_change; else fail resume_refuses_data_order_change "exit $rc: $(cat err.txt)"; fi

# 8. sample refuses a tokenizer the model was not trained with
$A tokenize train --vocab 300 -o other.tok "$ROOT"/testdata/corpus/sea.txt 2> /dev/null
$A sample base --tokenizer other.tok -n 5 > /dev/null 2> err.txt
rc=$?
if [ $rc -eq 1 ] && grep -q "not the one this model was trained with" err.txt; then pass sample_refuses_other_tokenizer; else fail sample_refuses_other_tokenizer "exit $rc: $(cat err.txt)"; fi

# 9. eval refuses shards made with another tokenizer (the ids would mean
# other words: a loss that looks like an answer), naming both; --force
# evaluates anyway
$A tokenize encode -q -t other.tok -o other --val-fraction 0 --chunk-tokens 1024 \
	"$ROOT"/testdata/corpus/sea.txt 2> err.txt
$A eval base --data other_train.shard > /dev/null 2> err.txt
rc=$?
if [ $rc -eq 1 ] && grep -q "'other_train.shard' was made with tokenizer 0x[0-9a-f]\{16\}, but '.*' was trained with tokenizer 0x[0-9a-f]\{16\}.*--force" err.txt &&
   $A eval base --data other_train.shard --force > ev.txt 2> err.txt && grep -q '^loss' ev.txt; then
	pass eval_refuses_other_tokenizer
else
	fail eval_refuses_other_tokenizer "exit $rc: $(cat err.txt)"
fi

# 10. OUT_DIR/config.ini reruns the run: the same losses step for step; its
# comment holds the command line
$A train -q "${TINY[@]}" --set train.out_dir=cfg1 --set train.steps=15 --set log.every=1 \
	--set optim.lr='2e-3' 2> err.txt
if grep -q "^# asyncpp train -q " cfg1/config.ini && grep -q "^#.*--set optim.lr=2e-3" cfg1/config.ini &&
   $A train -q -c cfg1/config.ini --set train.out_dir=cfg2 2> err.txt &&
   diff <(cut -d, -f1,2,4,6,7 cfg1/metrics.csv) <(cut -d, -f1,2,4,6,7 cfg2/metrics.csv) > d.txt &&
   [ "$(wc -l < cfg2/metrics.csv)" = 16 ]; then
	pass config_ini_reruns_the_run
else
	fail config_ini_reruns_the_run "$(cat err.txt) $(head -n 3 d.txt | tr '\n' ' ') $(head -n 3 cfg1/config.ini)"
fi

# 10b. data paths given relative are stored absolute (config.ini and the
# checkpoints), so eval and sample of the run work from another directory;
# a checkpoint that stored one relative (import-hf) has it found from the
# directory its run started in; a stored path that is gone is named, with
# where it came from and the option that overrides it
here=$(pwd -P)
mkdir -p elsewhere reldata imp/runs/hf
cp base/data/builtin.tok base/data/builtin_train.shard base/data/builtin_val.shard reldata/
$A train -q "${TINY[@]}" --set data.train=reldata/builtin_train.shard \
	--set data.val=./reldata/builtin_val.shard --set data.tokenizer=reldata/builtin.tok \
	--set train.out_dir=rel --set train.steps=2 2> err.txt
if grep -qx "train = $here/reldata/builtin_train.shard" rel/config.ini &&
   grep -qx "val = $here/reldata/builtin_val.shard" rel/config.ini &&
   grep -qx "tokenizer = $here/reldata/builtin.tok" rel/config.ini &&
   (cd elsewhere && $A eval "$here/rel" > ev.txt && $A sample "$here/rel" -n 4 > s.txt) 2>> err.txt
then
	pass data_paths_stored_absolute
else
	fail data_paths_stored_absolute "$(grep -E '^(train|val|tokenizer) =' rel/config.ini | tr '\n' ' ') $(cat err.txt)"
fi
(cd imp && $A import-hf "$TESTDATA/hf/llama" -o runs/hf/ckpt-00000000.ckpt --tokenizer-out hf.tok \
	--set train.out_dir=runs/hf) > /dev/null 2> err.txt
if grep -q '^tokenizer = hf.tok$' <($A inspect -v imp/runs/hf/ckpt-00000000.ckpt 2>&1) &&
   (cd elsewhere && $A sample "$here/imp/runs/hf" -n 4 > s.txt) 2>> err.txt; then
	pass relative_stored_path_found_from_the_run
else
	fail relative_stored_path_found_from_the_run "$(cat err.txt)"
fi
# a resume from another directory continues in the checkpoint's run folder
# (train.out_dir is stored as given, relative to where the run started), not
# in a new folder of that name under the working directory
(cd elsewhere && $A train -q --resume "$here/rel" --set train.steps=4) 2> err.txt
if [ -f rel/ckpt-00000004.ckpt ] && [ ! -e elsewhere/rel ] &&
   [ "$(grep -c '^[0-9]' rel/metrics.csv)" = 4 ]; then
	pass resume_from_elsewhere_continues_in_the_run_folder
else
	fail resume_from_elsewhere_continues_in_the_run_folder "$(ls rel elsewhere | tr '\n' ' ') $(cat err.txt)"
fi
# a relative log.metrics is stored absolute too: the resumed steps go to
# the run's metrics file, not to a new one where the resume is started
mkdir -p p3 && (cd p3 && $A train -q "${TINY[@]}" \
	--set data.train="$here/base/data/builtin_train.shard" \
	--set data.val="$here/base/data/builtin_val.shard" \
	--set data.tokenizer="$here/base/data/builtin.tok" \
	--set train.out_dir=runs/a --set log.metrics=m.csv --set train.steps=4) 2> err.txt
(cd elsewhere && $A train -q --resume "$here/p3/runs/a" --set train.steps=6) 2>> err.txt
if [ ! -e elsewhere/m.csv ] && [ "$(grep -c '^[0-9]' p3/m.csv)" = 6 ]; then
	pass relative_log_metrics_followed_on_resume
else
	fail relative_log_metrics_followed_on_resume "$(ls elsewhere p3 | tr '\n' ' ') $(head -c 300 err.txt)"
fi
mv reldata/builtin.tok reldata/moved.tok
mv reldata/builtin_val.shard reldata/moved.shard
(cd elsewhere && $A sample "$here/rel" -n 4) > /dev/null 2> err.txt
(cd elsewhere && $A eval "$here/rel") > /dev/null 2>> err.txt
(cd elsewhere && $A export --format hf -o hfout "$here/rel") > /dev/null 2> export.err
if grep -qF "data.tokenizer = $here/reldata/builtin.tok, stored in the checkpoint '$here/rel/ckpt-00000004.ckpt', is not there; give the tokenizer with --tokenizer FILE" err.txt &&
   grep -qF "data.tokenizer = $here/reldata/builtin.tok, stored in the checkpoint '$here/rel/ckpt-00000004.ckpt', is not there; give the tokenizer with --tokenizer FILE (or --no-tokenizer)" export.err &&
   [ ! -e elsewhere/hfout ] &&
   grep -qF "data.val = $here/reldata/builtin_val.shard, stored in the checkpoint '$here/rel/ckpt-00000004.ckpt', matches no shard file or directory; give the shards with --data SHARDS" err.txt
then
	pass missing_stored_path_names_its_origin
else
	fail missing_stored_path_names_its_origin "$(cat err.txt export.err)"
fi
# train --resume too: the stored path no -c or --set replaced, with the --set
# that overrides it (before: the loader's bare "no such shard file")
(cd elsewhere && $A train -q --resume "$here/rel" --set train.steps=6) > /dev/null 2> err.txt
if grep -qF "data.val = $here/reldata/builtin_val.shard, stored in the checkpoint '$here/rel/ckpt-00000004.ckpt', matches no shard file or directory; give the shards with --set data.val=SHARDS" err.txt
then
	pass resume_missing_stored_path_names_its_origin
else
	fail resume_missing_stored_path_names_its_origin "$(cat err.txt)"
fi

# 11. log.tensorboard: an event file a reader written from the format's
# definition (tests/scripts/tb_events.py) accepts, checksums and all, whose
# scalars are the metrics file's values
$A train -q "${TINY[@]}" "${DATA[@]}" --set train.out_dir=tb --set train.steps=12 --set log.every=4 \
	--set eval.every=6 --set eval.batches=1 --set log.tensorboard=tb/events 2> err.txt
ev=$(ls tb/events/events.out.tfevents.* 2> /dev/null | head -n 1)
if ! command -v python3 > /dev/null; then
	skip tensorboard_events_match_metrics "no python3"
elif [ -n "$ev" ] && out=$(python3 "$ROOT/tests/scripts/tb_events.py" "$ev" tb/metrics.csv) &&
     [[ $out == "ok "* ]]; then
	pass "tensorboard_events_match_metrics ($out)"
else
	fail tensorboard_events_match_metrics "${out:-no event file}: $(cat err.txt)"
fi

# 12. a metrics file of an earlier version (ten columns) gets today's header
# when a resumed run appends to it; old rows keep their fields, new rows
# have all twelve
$A train -q "${TINY[@]}" "${DATA[@]}" --set train.out_dir=old --set train.steps=10 --set log.every=1 2> err.txt
cut -d, -f1-10 old/metrics.csv > m && mv m old/metrics.csv
if $A train -q --resume old --set train.steps=12 2> err.txt &&
   [ "$(head -n 1 old/metrics.csv)" = "step,tokens,wall_s,loss,val_loss,lr,grad_norm,tokens_per_s,mfu,bubble,skipped,time" ] &&
   [ "$(sed -n 2p old/metrics.csv | awk -F, '{print NF}')" = 10 ] &&
   [ "$(grep '^12,' old/metrics.csv | head -n 1 | awk -F, '{print NF}')" = 12 ] &&
   $A plot old/metrics.csv > /dev/null 2>> err.txt; then
	pass old_metrics_header_upgraded
else
	fail old_metrics_header_upgraded "$(head -n 2 old/metrics.csv | tr '\n' ' ') $(cat err.txt)"
fi

# 13. checkpoint.every_minutes checkpoints by the clock with checkpoint.every 0
$A train -q "${TINY[@]}" "${DATA[@]}" --set train.out_dir=clock --set train.steps=200 --set log.every=5 \
	--set checkpoint.every=0 --set checkpoint.every_minutes=0.00002 --set checkpoint.keep=1000 2> err.txt
n=$(ls clock/ckpt-*.ckpt 2> /dev/null | wc -l)
if [ "$n" -gt 2 ] && [ -f clock/ckpt-00000200.ckpt ]; then
	pass "checkpoints_by_the_clock ($n)"
else
	fail checkpoints_by_the_clock "$n checkpoints: $(cat err.txt)"
fi

# 14. the run line says which batches validation uses, and eval with that
# --batches gives the logged val_loss
$A train "${TINY[@]}" "${DATA[@]}" --set train.out_dir=val --set train.steps=10 --set eval.every=10 \
	--set eval.batches=3 > /dev/null 2> err.txt
logged=$(grep '^10,' val/metrics.csv | cut -d, -f5 | grep . | head -n 1)
if grep -q "validation every 10 steps on the first 3 batches" err.txt &&
   $A eval val --batches 3 > ev.txt 2>> err.txt &&
   [ "$(awk '/^loss/ {print $2}' ev.txt)" = "$(printf '%.4f' "$logged")" ]; then
	pass eval_repeats_training_validation
else
	fail eval_repeats_training_validation "logged $logged, eval $(grep '^loss' ev.txt): $(head -c 300 err.txt)"
fi

# 14b. the eval command a run suggests at its end prints the last val_loss
# it logged, to the printed precision: eval defaults to the run's
# eval.batches and batch size on its data.val (here the training shard, of
# far more batches than eval.batches), through a 2BW pipeline
$A train "${TINY[@]}" --set data.train=base/data/builtin_train.shard \
	--set data.val=base/data/builtin_train.shard --set data.tokenizer=base/data/builtin.tok \
	--set train.out_dir=val2 --set train.steps=6 --set log.every=3 --set eval.every=3 \
	--set eval.batches=2 --set train.schedule=2bw --set pipeline.stages=2 \
	--set pipeline.micro_batches=2 > /dev/null 2> err.txt
logged=$(grep '^6,' val2/metrics.csv | cut -d, -f5 | grep . | head -n 1)
shown=$(grep -o '^step 6/6 .* val [0-9.]*' err.txt | awk '{print $NF}')
suggested=$(sed -n 's/^  evaluate:  //p' err.txt) # PROG eval CKPT (PROG: 14c)
if [ -n "$logged" ] && [ "$shown" = "$(printf '%.4f' "$logged")" ] && [ -n "$suggested" ] &&
   $A ${suggested#* } > ev.txt 2>> err.txt && [ "$(awk '/^loss/ {print $2}' ev.txt)" = "$shown" ] &&
   grep -q '^evaluated   2 x 4 x 32 = 256 tokens: batches 0 to 1 of [0-9]*$' ev.txt; then
	pass suggested_eval_prints_the_logged_val_loss
else
	fail suggested_eval_prints_the_logged_val_loss "logged $logged ($shown), '$suggested': $(cat ev.txt | tr '\n' ' ') $(head -c 300 err.txt)"
fi

# 14c. hints begin with the program as it was invoked: the bare name when
# it was found through PATH, the path as typed otherwise
mkdir -p bin
ln -sf "$A" bin/asyncpp
PATH=$PWD/bin:$PATH asyncpp train "${TINY[@]}" "${DATA[@]}" --set train.out_dir=prog \
	--set train.steps=1 > /dev/null 2> err1.txt
(cd bin && ./asyncpp train "${TINY[@]}" --set data.train=../base/data/builtin_train.shard \
	--set data.tokenizer=../base/data/builtin.tok --set train.out_dir=../prog --set train.steps=1 \
	--overwrite) > /dev/null 2> err2.txt
if grep -q '^  evaluate:  asyncpp eval .*prog/ckpt-00000001.ckpt$' err1.txt &&
   grep -q '^  evaluate:  ./asyncpp eval .*prog/ckpt-00000001.ckpt$' err2.txt &&
   grep -q '^  sample:    ./asyncpp sample ' err2.txt; then
	pass hints_name_the_program_as_invoked
else
	fail hints_name_the_program_as_invoked "$(cat err1.txt err2.txt)"
fi

# 14d. pipeline.split defaults to balanced, even stays selectable, and a cut
# whose lightest stage's modelled cost is more than 20% below the heaviest's
# is named with the split to use (8 layers of width 32, a 1024-token head)
CUT=(--set model.n_layer=8 --set model.vocab_size=1024 --set train.steps=0
     --set train.schedule=1f1b --set pipeline.stages=2)
$A train "${TINY[@]}" "${DATA[@]}" "${CUT[@]}" --set train.out_dir=cut1 > /dev/null 2> err1.txt
$A train "${TINY[@]}" "${DATA[@]}" "${CUT[@]}" --set pipeline.split=even \
	--set train.out_dir=cut2 > /dev/null 2> err2.txt
if grep -q ' 2 stage(s) of 5,3 layers (balanced) ' err1.txt && ! grep -q 'warning: pipeline.split' err1.txt &&
   grep -q ' 2 stage(s) of 4,4 layers (even) ' err2.txt &&
   grep -qF "warning: pipeline.split = even (layers 4,4) models stage 0 at 68% of stage 1's cost (the last stage holds the head), so stage 0 waits for it every step; set pipeline.split = balanced (layers 5,3: the lightest stage at 98% of the heaviest)" err2.txt
then
	pass split_balanced_by_default_uneven_named
else
	fail split_balanced_by_default_uneven_named "$(cat err1.txt err2.txt)"
fi

# 15. sample.every: the text logged at a step is what `asyncpp sample`
# (greedy) writes from that step's checkpoint, and sampling changes nothing
# in the run (the final checkpoint is byte-identical without it)
$A train -q "${TINY[@]}" "${DATA[@]}" --set train.out_dir=smp --set train.steps=20 \
	--set sample.every=10 --set sample.tokens=12 --set sample.prompt=Once 2> err.txt
$A train -q "${TINY[@]}" "${DATA[@]}" --set train.out_dir=nosmp --set train.steps=20 2>> err.txt
want=$($A sample smp/ckpt-00000020.ckpt --prompt Once -n 12 --temperature 0 2>> err.txt | sed -z 's/\n$//; s/\n/\\n/g')
got=$(grep '^step 20: ' smp/samples.txt | sed 's/^step 20: //')
if [ "$(grep -c '^step ' smp/samples.txt)" = 2 ] && [ -n "$got" ] && [ "$got" = "$want" ] &&
   $A inspect --diff smp/ckpt-00000020.ckpt nosmp/ckpt-00000020.ckpt > d.txt 2>> err.txt &&
   grep -Eq "^([0-9]+) tensors compared, \1 identical" d.txt; then
	pass sample_during_training_matches_sample
else
	fail sample_during_training_matches_sample "got '$got', sample gives '$want': $(head -c 300 err.txt) $(head -c 200 d.txt)"
fi

# 15b. bench train splits a step (schedule none) into its phases: data,
# forward, backward, optimizer, each timed (here by the host clock), summing
# to a step of the order of the measured ms/step; a pipeline prints no split
BT=(--set model.n_layer=2 --set model.d_model=64 --set model.n_head=4 --set model.seq_len=32
    --set train.batch_size=4 --set model.vocab_size=512 --steps 2 --warmup 1 --threads 1)
$A bench train "${BT[@]}" > bt.txt 2> err.txt
$A bench train "${BT[@]}" --set train.schedule=2bw --set pipeline.stages=2 > bt2.txt 2>> err.txt
phases=$(awk '/^time per phase/ {on = 1; next} on && NF == 4 && $3 == "ms" && $2 >= 0 {n++} on && $1 == "step" {print n, ($2 > 0)}' bt.txt)
ratio=$(awk '$1 ~ /^[0-9]+$/ && NF == 9 {ms = $3} /^  step / {s = $2} END {if (ms > 0) printf "%.0f", 10 * s / ms}' bt.txt)
if [ "$phases" = "4 1" ] && [ "${ratio:-0}" -ge 2 ] && [ "${ratio:-0}" -le 50 ] &&
   ! grep -q 'time per phase' bt2.txt; then
	pass bench_train_time_per_phase
else
	fail bench_train_time_per_phase "phases '$phases', step/ms ratio x10 '$ratio': $(cat bt.txt err.txt | head -c 600)"
fi

# 16. bench train --sweep overhead: a row for every optimizer x {sync, 2bw,
# 2bw+ef, 2bw+predict}; 2bw keeps one extra version, ef one buffer, predict
# one more version and a predicted copy of each; the bytes accounted explain
# most of each child's peak RSS
n_opt=$($A train --print-config | awk '/^#/ { c = c " " substr($0, 3); next } { print c; c = "" }' |
	grep -o 'one of [a-z|, ]*; default adamw' | head -n 1 | tr ',' '\n' | grep -c .)
$A bench train --sweep overhead --set model.n_layer=4 --set model.d_model=128 --set model.n_head=4 \
	--set model.seq_len=64 --set train.batch_size=4 --set model.vocab_size=2048 --steps 1 \
	--warmup 0 --threads 1 > ov.txt 2> err.txt
rows=$(grep -cE '^[a-z]+ +(sync|2bw|2bw\+ef|2bw\+predict) ' ov.txt)
# (under AddressSanitizer, whose quarantine keeps freed memory resident, the
# peak RSS says little: only the upper bound is checked there)
lo=50; [ -n "${ASAN_OPTIONS:-}" ] && lo=0
bad=$(awk -v lo=$lo '$2 ~ /^(sync|2bw)/ { r = $11; sub(/%/, "", r); if (r + 0 < lo || r + 0 > 120) print }
	$1 == "adamw" && $8 != "1.00" { print "adamw is " $8 "x itself" }' ov.txt)
shape=$(awk '$1 == "adamw" { printf "%s %.0f %.0f;", $2, $4 / $3, $6 / $3 }' ov.txt)
if [ "$rows" -eq $((4 * n_opt)) ] && [ -z "$bad" ] &&
   [ "$shape" = "sync 0 0;2bw 1 0;2bw+ef 1 1;2bw+predict 2 3;" ]; then
	pass "bench_overhead_table ($rows rows)"
else
	fail bench_overhead_table "$rows rows for $n_opt optimizers, shape '$shape', out of range: $bad $(cat err.txt)"
fi

# checkpoint.keep with train.out_dir given with a trailing slash: a run
# resumed from an older checkpoint, with more newer ones than it keeps,
# keeps the one it writes (the listing and the writer name files alike)
$A train -q "${TINY[@]}" "${DATA[@]}" --set train.steps=8 --set checkpoint.every=2 \
	--set checkpoint.keep=4 --set train.out_dir=slash/ 2> err.txt &&
	$A train -q --resume slash/ckpt-00000002.ckpt --set train.steps=4 \
		--set checkpoint.keep=2 2>> err.txt
kept=$(ls slash | grep ckpt | tr '\n' ' ')
if [ "$kept" = "ckpt-00000004.ckpt ckpt-00000006.ckpt ckpt-00000008.ckpt " ]; then
	pass keep_with_trailing_slash
else fail keep_with_trailing_slash "kept '$kept': $(head -c 300 err.txt)"; fi
