#!/usr/bin/env bash
# faults.sh - faults on purpose (issue 12), each case asserting what
# survives: kill -9 and SIGTERM at random points, a full disk, a damaged
# newest checkpoint, two trainers on one directory, a resume into another
# run's directory, orphaned temporaries, a metrics path that is not a
# metrics file. Every run that is killed is resumed to the end and its
# losses must equal the uninterrupted run's, step for step: no data lost.
# The closing table (faults injected, runs surviving, data lost) is printed
# as "# " lines. FAULT_ROUNDS (default 4) sets the kill -9 and SIGTERM counts.
. "$ROOT/tests/lib.sh"
A=$ASYNCPP
ROUNDS=${FAULT_ROUNDS:-4}
SEED=${FAULT_SEED:-$$}
RANDOM=$SEED
TINY=(--set model.n_layer=2 --set model.d_model=32 --set model.n_head=2 --set model.seq_len=32
      --set train.batch_size=4 --set log.every=1 --set eval.every=0 --set train.threads=1)
injected=0 survived=0 lost=0
# tally NAME OK LOST: one fault's outcome for the table
tally() { injected=$((injected + 1)); [ "$2" = 1 ] && survived=$((survived + 1)); lost=$((lost + $3)); }

$A train -q "${TINY[@]}" --set train.out_dir=base --set train.steps=1 2> err.txt ||
	{ fail faults_setup "$(cat err.txt)"; exit 0; }
DATA=(--set data.train=base/data/builtin_train.shard --set data.val=base/data/builtin_val.shard
      --set data.tokenizer=base/data/builtin.tok)
LONG=("${TINY[@]}" "${DATA[@]}" --set train.steps=1500 --set checkpoint.every=25 --set checkpoint.keep=2)
if ! $A train -q "${LONG[@]}" --set train.out_dir=full 2> err.txt; then
	fail faults_reference_run "$(cat err.txt)"
	exit 0
fi
losses() { cut -d, -f1,4 "$1/metrics.csv"; }

# wait until DIR's metrics have more than N rows (or 10 s)
wait_rows() {
	for _ in $(seq 1 200); do
		[ -f "$1/metrics.csv" ] && [ "$(wc -l < "$1/metrics.csv")" -gt "$2" ] && return 0
		sleep 0.05
	done
	return 1
}

# 1. kill -9 (or SIGTERM) at a random step; resume until the run completes;
# the losses then equal the uninterrupted run's and no temporary is left
kill_case() {
	local sig=$1 i=$2 dir=$1_$2 at=$((RANDOM % 1200 + 20))
	rm -rf "$dir"
	$A train -q "${LONG[@]}" --set train.out_dir="$dir" 2> run.err &
	local pid=$!
	wait_rows "$dir" "$at"
	kill -"$sig" $pid 2> /dev/null
	wait $pid
	local rc=$? tries=0
	# a kill before the first checkpoint leaves nothing to resume: start again
	while [ "$tries" -lt 3 ]; do
		tries=$((tries + 1))
		if ls "$dir"/ckpt-*.ckpt > /dev/null 2>&1; then
			$A train -q --resume "$dir" 2> resume.err && break
		else
			$A train -q "${LONG[@]}" --set train.out_dir="$dir" --overwrite 2> resume.err && break
		fi
	done
	local n_tmp
	n_tmp=$(ls "$dir" | grep -c '\.tmp\.')
	if [ -f "$dir/ckpt-00001500.ckpt" ] && diff <(losses full) <(losses "$dir") > d.txt &&
	   [ "$n_tmp" = 0 ]; then
		pass "${sig}_${i}_at_step_${at}_resumes_exactly"
		tally "$sig" 1 0
	else
		fail "${sig}_${i}_at_step_${at}_resumes_exactly" "exit $rc, $n_tmp temporaries left, $(head -n 3 d.txt | tr '\n' ' ') $(head -c 300 resume.err)"
		tally "$sig" 0 1
	fi
}
for i in $(seq 1 "$ROUNDS"); do kill_case KILL "$i"; done
for i in $(seq 1 "$ROUNDS"); do kill_case TERM "$i"; done

# a closed terminal or ssh session (SIGHUP) stops the run at a step with a
# checkpoint, as SIGTERM does, instead of losing what the last one missed
rm -rf hup
$A train -q "${LONG[@]}" --set train.out_dir=hup 2> hup.err &
pid=$!
wait_rows hup 30
kill -HUP $pid
wait $pid
rc=$?
step=$(sed -n 's/.*hung up: wrote .* at step \([0-9]*\);.*/\1/p' hup.err)
if [ $rc -eq 129 ] && [ -n "$step" ] && [ -f "hup/ckpt-$(printf %08d "$step").ckpt" ]; then
	pass "sighup_stops_at_step_${step}_with_a_checkpoint"
	tally HUP 1 0
else
	fail sighup_stops_with_a_checkpoint "exit $rc: $(head -c 300 hup.err)"
	tally HUP 0 1
fi

# 2. orphaned temporaries: a start removes those whose writer is gone (and
# says so), keeps a live process's, and --overwrite removes them all
mkdir -p orph && $A train -q "${TINY[@]}" "${DATA[@]}" --set train.steps=5 --set train.out_dir=orph 2> err.txt
printf 'partial' > orph/ckpt-00000009.ckpt.tmp.2147483646 # no such pid (above pid_max)
printf 'partial' > orph/ckpt-00000008.ckpt.tmp.$$         # this shell: alive
$A train --resume orph --set train.steps=10 > /dev/null 2> err.txt
if [ ! -e orph/ckpt-00000009.ckpt.tmp.2147483646 ] && [ -e orph/ckpt-00000008.ckpt.tmp.$$ ] &&
   grep -q "removed 'orph/ckpt-00000009.ckpt.tmp.2147483646'.*writer is gone" err.txt; then
	pass orphaned_temporaries_removed
	tally orphan 1 0
else
	fail orphaned_temporaries_removed "$(ls orph | tr '\n' ' ') $(cat err.txt)"
	tally orphan 0 0
fi
if $A train -q "${TINY[@]}" "${DATA[@]}" --set train.steps=5 --set train.out_dir=orph --overwrite 2> err.txt &&
   [ "$(ls orph | grep -c '\.tmp\.')" = 0 ]; then
	pass overwrite_removes_every_temporary
else
	fail overwrite_removes_every_temporary "$(ls orph | tr '\n' ' ') $(cat err.txt)"
fi

# 3. a damaged newest checkpoint: --resume DIR says so, takes the one
# before it, and the run still ends with the uninterrupted losses
rm -rf dmg && $A train -q "${LONG[@]}" --set train.out_dir=dmg --set checkpoint.keep=3 2> err.txt
rm dmg/ckpt-00001500.ckpt # as if killed before the end; then damage the newest left
newest=$(ls dmg/ckpt-*.ckpt | tail -n 1)
prev=$(ls dmg/ckpt-*.ckpt | tail -n 2 | head -n 1)
size=$(stat -c %s "$newest")
printf '\x5a' | dd of="$newest" bs=1 seek=$((size / 2)) conv=notrunc status=none
if $A train -q --resume dmg 2> err.txt && grep -q "cannot resume from '$newest'.*taking the checkpoint before it, '$prev'" err.txt &&
   diff <(losses full) <(losses dmg) > d.txt; then
	pass damaged_newest_checkpoint_falls_back
	tally damaged 1 0
else
	fail damaged_newest_checkpoint_falls_back "$(head -c 400 err.txt) $(head -n 3 d.txt | tr '\n' ' ')"
	tally damaged 0 1
fi

# 4. a full disk (file size limit): the checkpoint write fails with a clear
# error, leaves no temporary, and checkpoint.keep = 1 keeps the last good one
rm -rf full_disk && $A train -q "${TINY[@]}" "${DATA[@]}" --set train.steps=10 \
	--set checkpoint.every=5 --set checkpoint.keep=1 --set train.out_dir=full_disk 2> err.txt
good=$(ls full_disk/ckpt-*.ckpt)
ck_kb=$(( $(stat -c %s "$good") / 1024 ))
(ulimit -f $((ck_kb / 2)); trap '' XFSZ; exec $A train -q --resume full_disk --set train.steps=20 \
	--set checkpoint.every=5 --set checkpoint.keep=1) 2> err.txt
rc=$?
if [ $rc -eq 1 ] && grep -q "cannot write 'full_disk/ckpt-00000015.ckpt'" err.txt &&
   [ "$(ls full_disk | grep -c '\.tmp\.')" = 0 ] && [ "$(ls full_disk/ckpt-*.ckpt)" = "$good" ] &&
   $A inspect "$good" > /dev/null 2>&1; then
	pass full_disk_keeps_last_good_checkpoint
	tally full_disk 1 0
else
	fail full_disk_keeps_last_good_checkpoint "exit $rc: $(head -c 300 err.txt) $(ls full_disk | tr '\n' ' ')"
	tally full_disk 0 1
fi

# 5. a read-only out_dir is refused up front, naming it (root ignores modes)
if [ "$(id -u)" = 0 ]; then
	skip read_only_out_dir "running as root, whom file modes do not stop"
else
	mkdir -p ro && chmod 555 ro
	$A train -q "${TINY[@]}" "${DATA[@]}" --set train.steps=5 --set train.out_dir=ro 2> err.txt
	rc=$?
	if [ $rc -eq 1 ] && grep -q "'ro/train.lock'" err.txt; then pass read_only_out_dir; tally read_only 1 0
	else fail read_only_out_dir "exit $rc: $(cat err.txt)"; tally read_only 0 0; fi
	chmod 755 ro
fi

# 5b. a run folder made read-only after its run (its train.lock still opens)
# is named as not writable, not as missing; as root the run drops to nobody
rodir=$(mktemp -d /tmp/asyncpp-ro.XXXXXX) && chmod 755 "$rodir"
as_user=()
[ "$(id -u)" = 0 ] && as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups)
if [ "$(id -u)" = 0 ] && ! command -v setpriv > /dev/null; then
	skip read_only_run_folder "running as root without setpriv"
else
	$A train -q "${TINY[@]}" --set train.steps=2 --set train.out_dir="$rodir/ro" 2> err.txt
	[ "$(id -u)" = 0 ] && chown -R 65534:65534 "$rodir/ro"
	chmod 555 "$rodir/ro"
	"${as_user[@]}" $A train -q --resume "$rodir/ro" --set train.steps=4 2> err.txt
	rc=$?
	if [ $rc -eq 1 ] && grep -q "cannot write in '$rodir/ro' (train.out_dir): Permission denied" err.txt &&
	   ! grep -q "create it" err.txt; then
		pass read_only_run_folder
	else
		fail read_only_run_folder "exit $rc: $(cat err.txt)"
	fi
fi
chmod -R u+w "$rodir" 2> /dev/null
rm -rf "$rodir"

# 6. two trainers on one out_dir: the second fails naming the first's pid,
# and the first runs to its end untouched
rm -rf busy
$A train -q "${LONG[@]}" --set train.out_dir=busy 2> first.err &
pid=$!
wait_rows busy 5
$A train -q "${LONG[@]}" --set train.out_dir=busy --overwrite 2> err.txt
rc=$?
wait $pid
rc1=$?
if [ $rc -eq 1 ] && grep -q "'busy' is in use by another trainer (pid $pid" err.txt && [ $rc1 -eq 0 ] &&
   diff <(losses full) <(losses busy) > /dev/null; then
	pass second_trainer_refused_with_pid
	tally second_trainer 1 0
else
	fail second_trainer_refused_with_pid "exit $rc (first: $rc1): $(cat err.txt)"
	tally second_trainer 0 1
fi

# 6b. --resume of a directory whose trainer has written no checkpoint yet
# says it is in use (naming the pid), not that it holds no checkpoint
rm -rf conc
$A train -q "${LONG[@]}" --set checkpoint.every=0 --set train.out_dir=conc 2> first.err &
pid=$!
wait_rows conc 2
$A train -q --resume conc 2> err.txt
rc=$?
kill $pid 2> /dev/null
wait $pid
in_use="'conc' is in use by another trainer (pid $pid holds 'conc/train.lock')"
if [ $rc -eq 1 ] && grep -q "$in_use; it has written no checkpoint yet" err.txt &&
   ! grep -q "holds no checkpoint" err.txt; then
	pass resume_of_busy_dir_says_in_use
else
	fail resume_of_busy_dir_says_in_use "exit $rc: $(cat err.txt)"
fi

# 7. --resume of one run into another's directory is refused naming both,
# and the other run is untouched; --overwrite replaces it
rm -rf runx runy
$A train -q "${TINY[@]}" "${DATA[@]}" --set train.steps=10 --set checkpoint.every=5 --set train.out_dir=runx 2> err.txt
$A train -q "${TINY[@]}" "${DATA[@]}" --set train.steps=10 --set checkpoint.every=5 --set train.out_dir=runy --set train.seed=7 2> err.txt
before=$(cat runx/ckpt-*.ckpt runx/metrics.csv | md5sum)
$A train -q --resume runy/ckpt-00000010.ckpt --set train.steps=20 --set train.out_dir=runx 2> err.txt
rc=$?
after=$(cat runx/ckpt-*.ckpt runx/metrics.csv | md5sum)
if [ $rc -eq 1 ] && grep -q "'runx' holds another run (run 0x$(cut -c3- runx/run-id)" err.txt &&
   grep -q "'runy/ckpt-00000010.ckpt' (run 0x$(cut -c3- runy/run-id))" err.txt && [ "$before" = "$after" ]; then
	pass resume_into_other_run_refused
	tally other_run 1 0
else
	fail resume_into_other_run_refused "exit $rc: $(cat err.txt)"
	tally other_run 0 1
fi
if $A train -q --resume runy/ckpt-00000010.ckpt --set train.steps=20 --set train.out_dir=runx --overwrite 2> err.txt &&
   [ "$(ls runx/ckpt-*.ckpt | tr '\n' ' ')" = "runx/ckpt-00000015.ckpt runx/ckpt-00000020.ckpt " ] &&
   [ "$(cat runx/run-id)" = "$(cat runy/run-id)" ] && [ "$(sed -n 2p runx/metrics.csv | cut -d, -f1)" = 11 ]; then
	pass overwrite_replaces_other_run
else
	fail overwrite_replaces_other_run "$(cat err.txt) $(ls runx | tr '\n' ' ')"
fi
# resuming a run in its own directory (and a fork's continuation) still works
if $A train -q --resume runy --set train.steps=15 2> err.txt; then pass resume_own_run; else fail resume_own_run "$(cat err.txt)"; fi

# 7b. --overwrite removes the earlier run only once the new one is ready to
# start: a run refused while it sets up (no data file, a model that cannot
# be built, a pipeline cut that does not fit, log files that cannot be
# written) leaves every file in place, a user's own "*.tmp.N" file too; so
# does a resume refused for its tensorboard folder (no metrics cut back)
printf 'mine' > runx/notes.tmp.2147483646 && printf 'x' > tbfile
before=$(cat runx/ckpt-*.ckpt runx/metrics.csv runx/config.ini runx/run-id runx/notes.tmp.* | md5sum)
kept=1 why=
for bad in "data.train=nosuch.shard" "model.n_head=3" "pipeline.stages=9" \
	   "log.tensorboard=tbfile" "log.metrics=nodir/metrics.csv"; do
	$A train -q "${TINY[@]}" "${DATA[@]}" --set train.steps=5 --set train.out_dir=runx \
		--set "$bad" --overwrite 2> err.txt
	rc=$?
	after=$(cat runx/ckpt-*.ckpt runx/metrics.csv runx/config.ini runx/run-id runx/notes.tmp.* | md5sum)
	if [ $rc -ne 1 ] || [ "$before" != "$after" ] || grep -q -- "--overwrite: removed" err.txt; then
		kept=0 why="$why [$bad: exit $rc, $(head -c 300 err.txt)]"
	fi
done
$A train -q --resume runx/ckpt-00000015.ckpt --set log.tensorboard=tbfile 2> err.txt
rc=$?
after=$(cat runx/ckpt-*.ckpt runx/metrics.csv runx/config.ini runx/run-id runx/notes.tmp.* | md5sum)
[ $rc -eq 1 ] && [ "$before" = "$after" ] || kept=0 why="$why [resume: exit $rc, $(head -c 300 err.txt)]"
rm -f runx/notes.tmp.2147483646
if [ $kept = 1 ]; then
	pass overwrite_of_a_refused_run_loses_nothing
	tally refused_overwrite 1 0
else
	fail overwrite_of_a_refused_run_loses_nothing "$why"
	tally refused_overwrite 0 1
fi

# 7c. files the run did not make: only ckpt-NNNNNNNN.ckpt checkpoints are
# the run's. A user's ckpt-best.ckpt (a copy of step 2) is not resumed, and
# it, ckpt-00000002-good.ckpt and ckpt-keepme.ckpt outlive checkpoint.keep
# and --overwrite, each named once a run
rm -rf c4 && $A train -q "${TINY[@]}" "${DATA[@]}" --set train.steps=4 --set checkpoint.every=2 \
	--set checkpoint.keep=2 --set train.out_dir=c4 2> err.txt
cp c4/ckpt-00000002.ckpt c4/ckpt-best.ckpt && printf 'good' > c4/ckpt-00000002-good.ckpt &&
	printf 'keep' > c4/ckpt-keepme.ckpt
users=(c4/ckpt-best.ckpt c4/ckpt-00000002-good.ckpt c4/ckpt-keepme.ckpt)
mine=$(cat "${users[@]}" | md5sum)
$A train --resume c4 --set train.steps=6 --set checkpoint.keep=1 2> err.txt
rc=$?
if [ $rc -eq 0 ] && grep -q "resuming c4/ckpt-00000004.ckpt at step 4" err.txt &&
   [ "$(grep -c "'c4/ckpt-best.ckpt' is not named as train names its checkpoints" err.txt)" = 1 ] &&
   [ "$(LC_ALL=C ls c4/ckpt-0*.ckpt | tr '\n' ' ')" = "c4/ckpt-00000002-good.ckpt c4/ckpt-00000006.ckpt " ] &&
   [ "$(cat "${users[@]}" | md5sum)" = "$mine" ]; then
	pass users_checkpoint_names_not_resumed_or_rotated
else
	fail users_checkpoint_names_not_resumed_or_rotated "exit $rc: $(head -c 400 err.txt) $(ls c4 | tr '\n' ' ')"
fi
$A train -q "${TINY[@]}" "${DATA[@]}" --set train.steps=2 --set train.out_dir=c4 --overwrite 2> err.txt
rc=$?
left="c4/ckpt-00000002-good.ckpt c4/ckpt-00000002.ckpt c4/ckpt-best.ckpt c4/ckpt-keepme.ckpt "
if [ $rc -eq 0 ] && [ "$(LC_ALL=C ls c4/*.ckpt | tr '\n' ' ')" = "$left" ] &&
   [ "$(cat "${users[@]}" | md5sum)" = "$mine" ]; then
	pass overwrite_leaves_users_checkpoint_names
else
	fail overwrite_leaves_users_checkpoint_names "exit $rc: $(head -c 400 err.txt) $(ls c4 | tr '\n' ' ')"
fi

# 7e. a checkpoint of another run under a run's name (a copy from another
# folder, newer than the folder's own) records that run's id: it is not
# resumed from the folder, not rotated by checkpoint.keep, not removed by
# --overwrite, and named once a run
rm -rf c5 c6
$A train -q "${TINY[@]}" "${DATA[@]}" --set train.steps=4 --set checkpoint.every=2 \
	--set train.out_dir=c5 2> err.txt
$A train -q "${TINY[@]}" "${DATA[@]}" --set train.steps=8 --set checkpoint.every=8 \
	--set train.out_dir=c6 2>> err.txt
cp c6/ckpt-00000008.ckpt c5/ckpt-00000008.ckpt
theirs=$(md5sum < c5/ckpt-00000008.ckpt)
$A train --resume c5 --set train.steps=6 --set checkpoint.keep=1 2> err.txt
rc=$?
if [ $rc -eq 0 ] && grep -q "resuming c5/ckpt-00000004.ckpt at step 4" err.txt &&
   [ "$(grep -c "'c5/ckpt-00000008.ckpt' is a checkpoint of another run" err.txt)" = 1 ] &&
   [ "$(LC_ALL=C ls c5/*.ckpt | tr '\n' ' ')" = "c5/ckpt-00000006.ckpt c5/ckpt-00000008.ckpt " ] &&
   [ "$(md5sum < c5/ckpt-00000008.ckpt)" = "$theirs" ]; then
	pass other_runs_checkpoint_not_resumed_or_rotated
else
	fail other_runs_checkpoint_not_resumed_or_rotated "exit $rc: $(head -c 400 err.txt) $(ls c5 | tr '\n' ' ')"
fi
$A train -q "${TINY[@]}" "${DATA[@]}" --set train.steps=2 --set train.out_dir=c5 --overwrite 2> err.txt
rc=$?
if [ $rc -eq 0 ] && [ "$(LC_ALL=C ls c5/*.ckpt | tr '\n' ' ')" = "c5/ckpt-00000002.ckpt c5/ckpt-00000008.ckpt " ] &&
   [ "$(md5sum < c5/ckpt-00000008.ckpt)" = "$theirs" ]; then
	pass overwrite_leaves_other_runs_checkpoint
else
	fail overwrite_leaves_other_runs_checkpoint "exit $rc: $(head -c 400 err.txt) $(ls c5 | tr '\n' ' ')"
fi

# 7f. a backup copy of a run's checkpoints (a folder without the run's
# run-id) resumed by file continues in the run's stored train.out_dir, not
# in the backup folder: nothing is written there and checkpoint.keep
# removes none of the copies; a rollback never removes another run's
# checkpoint
rm -rf bk bkrun && mkdir bk
$A train -q "${TINY[@]}" "${DATA[@]}" --set train.steps=4 --set checkpoint.every=2 \
	--set train.out_dir=bkrun 2> err.txt
cp bkrun/ckpt-00000002.ckpt bkrun/ckpt-00000004.ckpt bk/
$A train -q --resume bk/ckpt-00000004.ckpt --set train.steps=6 --set checkpoint.keep=1 2> err.txt
rc=$?
if [ $rc -eq 0 ] && [ "$(ls bk | tr '\n' ' ')" = "ckpt-00000002.ckpt ckpt-00000004.ckpt " ] &&
   [ -f bkrun/ckpt-00000006.ckpt ]; then
	pass backup_copy_resumed_into_its_run
else
	fail backup_copy_resumed_into_its_run "exit $rc: $(head -c 300 err.txt) bk: $(ls bk | tr '\n' ' ')"
fi
rm -rf rb && $A train -q "${TINY[@]}" "${DATA[@]}" --set train.steps=8 --set checkpoint.every=8 \
	--set train.out_dir=rb 2> err.txt
cp c6/ckpt-00000008.ckpt rb/ckpt-00000050.ckpt
theirs=$(md5sum < rb/ckpt-00000050.ckpt)
$A train -q --resume rb --set train.steps=30 --set optim.lr=300 --set optim.warmup=0 \
	--set checkpoint.every=1 --set train.on_divergence=rollback 2> err.txt
if [ -f rb/ckpt-00000050.ckpt ] && [ "$(md5sum < rb/ckpt-00000050.ckpt)" = "$theirs" ] &&
   grep -q "rolled back to" err.txt && ! grep -q "the newest rb/ckpt-00000050.ckpt" err.txt; then
	pass rollback_leaves_other_runs_checkpoint
else
	fail rollback_leaves_other_runs_checkpoint "$(grep -m 2 'rolled back\|diverged' err.txt | head -c 400)"
fi
# a run that would reach that step (and replace it) is refused up front
$A train -q --resume rb --set train.steps=60 2> err.txt
rc=$?
if [ $rc -eq 1 ] && grep -q "'rb/ckpt-00000050.ckpt' is a checkpoint of another run (0x[0-9a-f]*); this run would replace it when it reaches step 50" err.txt &&
   [ "$(md5sum < rb/ckpt-00000050.ckpt)" = "$theirs" ]; then
	pass other_runs_checkpoint_ahead_refused
else
	fail other_runs_checkpoint_ahead_refused "exit $rc: $(head -c 300 err.txt)"
fi

# 7d. a user's file where a run would write its own (the config.ini given
# with -c, a run-id, a train.lock, a checkpoint's name, the samples, the
# built-in corpus's tokenizer) is refused, naming it, and left as it was,
# even with --overwrite
kept=1 why=
for f in config.ini run-id train.lock ckpt-00000002.ckpt samples.txt data/builtin.tok; do
	rm -rf own && mkdir -p own/data && printf '[train]\nsteps = 2\n' > "own/$f"
	data=("${DATA[@]}") conf=()
	[ "$f" = data/builtin.tok ] && data=()
	[ "$f" = config.ini ] && conf=(-c own/config.ini)
	[ "$f" = samples.txt ] && conf=(--set sample.every=1)
	for over in "" --overwrite; do
		$A train -q "${conf[@]}" "${TINY[@]}" "${data[@]}" --set train.steps=2 --set train.out_dir=own \
			$over 2> err.txt
		rc=$?
		# refused, naming the file, which is as it was, and nothing written
		if [ $rc -ne 1 ] || ! grep -q "'own/$f' \(is not\|was not\|has the name\)" err.txt ||
		   [ "$(cat "own/$f")" != "$(printf '[train]\nsteps = 2')" ] ||
		   ls own/ckpt-*.ckpt own/metrics.csv 2> /dev/null | grep -qv "own/$f"; then
			kept=0 why="$why [$f $over: exit $rc, $(head -c 300 err.txt), $(ls own | tr '\n' ' ')]"
		fi
	done
done
if [ $kept = 1 ]; then pass users_files_in_run_folder_not_replaced
else fail users_files_in_run_folder_not_replaced "$why"; fi

# 8. a fresh run where an earlier one left metrics (but no checkpoint) is
# refused; a log.metrics path that is not a metrics file is never touched
rm -rf early && mkdir early && printf 'step,tokens\n1,128\n' > early/metrics.csv
$A train -q "${TINY[@]}" "${DATA[@]}" --set train.steps=5 --set train.out_dir=early 2> err.txt
rc=$?
if [ $rc -eq 1 ] && grep -q "holds the metrics of an earlier run" err.txt && [ "$(wc -l < early/metrics.csv)" = 2 ]; then
	pass earlier_metrics_not_replaced
else
	fail earlier_metrics_not_replaced "exit $rc: $(cat err.txt)"
fi
printf '[train]\nsteps = 5\n' > run.ini
cp run.ini run.ini.orig
$A train -q "${TINY[@]}" "${DATA[@]}" --set train.steps=5 --set train.out_dir=mistyped \
	--set log.metrics=run.ini --overwrite 2> err.txt
rc=$?
if [ $rc -eq 1 ] && grep -q "log.metrics = '$(pwd -P)/run.ini' is a file that is not a metrics file" err.txt &&
   cmp -s run.ini run.ini.orig; then
	pass mistyped_log_metrics_untouched
	tally mistyped_metrics 1 0
else
	fail mistyped_log_metrics_untouched "exit $rc: $(cat err.txt)"
	tally mistyped_metrics 0 1
fi

echo "# fault injection (seed $SEED, FAULT_ROUNDS=$ROUNDS)"
echo "# | faults injected | runs surviving | data lost |"
echo "# | $injected | $survived | $lost |"
