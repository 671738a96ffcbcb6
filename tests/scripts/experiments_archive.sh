#!/usr/bin/env bash
# experiments_archive.sh - experiments/run.sh keeps finished runs across
# machines: a fresh work folder gets every archived run back (its metrics
# byte for byte), a finished run not yet archived goes in (done last), a
# half-written archive entry (NAME.tmp, or one without done) is never
# restored, and a run being made here is never overwritten. Runs on a copy
# of run.sh and report.py in a scratch tree (`run.sh status`: no training).
. "$ROOT/tests/lib.sh"
T=$PWD/tree
mkdir -p "$T/experiments/archive" "$T/wk/runs"
cp "$ROOT/experiments/run.sh" "$ROOT/experiments/report.py" "$T/experiments/"

# a finished run, as run.sh leaves one (configuration from asyncpp itself)
mkrun() {
	local d=$1
	mkdir -p "$d"
	"$ASYNCPP" train --print-config --set train.steps=300 --set model.n_layer=4 \
		--set model.d_model=128 --set model.n_head=4 --set model.seq_len=128 > "$d/planned.ini"
	cp "$d/planned.ini" "$d/config.ini"
	printf 'step,tokens,wall_s,loss,val_loss\n1,2048,0.1,8.3,\n300,614400,30,4.5,4.6\n' > "$d/metrics.csv"
	printf 'status=ok\nwall_s=30.0\ncpu_s=29.0\ncode=test\ncontinued=no\n' > "$d/done"
}
A=$T/experiments/archive
mkrun "$T/src/r1"
mkdir -p "$A/adamw-sync-lr1e-3-s1"
cp "$T/src/r1/planned.ini" "$T/src/r1/config.ini" "$A/adamw-sync-lr1e-3-s1/"
gzip -9nc "$T/src/r1/metrics.csv" > "$A/adamw-sync-lr1e-3-s1/metrics.csv.gz"
cp "$T/src/r1/done" "$A/adamw-sync-lr1e-3-s1/"
# an entry cut off before its done, and a .tmp folder of a cut-off copy
mkdir -p "$A/muon-sync-lr1e-2-s1" "$A/muon-async-lr1e-2-s1.tmp"
cp "$T/src/r1/config.ini" "$A/muon-sync-lr1e-2-s1/"
cp "$T/src/r1/done" "$T/src/r1/config.ini" "$A/muon-async-lr1e-2-s1.tmp/"
# an archived run that is being made again here (a log, no done)
cp -r "$A/adamw-sync-lr1e-3-s1" "$A/adamw-async-lr1e-3-s1"
mkdir -p "$T/wk/runs/adamw-async-lr1e-3-s1"
echo "step 12 of 300" > "$T/wk/runs/adamw-async-lr1e-3-s1/log.txt"
# a run finished here before the archive existed
mkrun "$T/wk/runs/adamw-async-ef-lr1e-3-s1"

ASYNCPP=$ASYNCPP WORK=$T/wk bash "$T/experiments/run.sh" status > st.txt 2> err.txt
rc=$?
R=$T/wk/runs
ok=1 why=
check() { eval "$1" || { ok=0; why="$why; $2"; }; }
check '[ $rc -eq 0 ]' "run.sh status exit $rc: $(head -c 200 err.txt)"
check 'cmp -s "$R/adamw-sync-lr1e-3-s1/metrics.csv" "$T/src/r1/metrics.csv"' "restored metrics differ"
check '[ -f "$R/adamw-sync-lr1e-3-s1/done" ] && [ -f "$R/adamw-sync-lr1e-3-s1/config.ini" ]' "restored run incomplete"
check '[ ! -e "$R/muon-sync-lr1e-2-s1" ]' "an entry without done was restored"
check '[ ! -e "$R/muon-async-lr1e-2-s1.tmp" ] && [ ! -e "$A/muon-async-lr1e-2-s1.tmp" ]' "a .tmp entry was restored or kept"
check '[ ! -f "$R/adamw-async-lr1e-3-s1/done" ] && grep -q "step 12" "$R/adamw-async-lr1e-3-s1/log.txt"' "a run being made was overwritten"
check '[ -f "$A/adamw-async-ef-lr1e-3-s1/done" ] && zcmp -s "$A/adamw-async-ef-lr1e-3-s1/metrics.csv.gz" "$R/adamw-async-ef-lr1e-3-s1/metrics.csv"' "a finished run was not archived"
check 'grep -q "finished" st.txt' "status printed no count: $(head -c 200 st.txt)"
if [ $ok = 1 ]; then
	pass experiments_archive_round_trip
else
	fail experiments_archive_round_trip "${why#; }"
fi
