#!/usr/bin/env bash
# signals.sh - a command ended by a signal leaves no half-written output
# (io/staged.h): `tokenize encode` stopped while its shards are staged
# removes them, keeps the shards it was replacing and dies by the signal;
# an export that fails leaves no folder it made. (train's own signal
# handling, stop at a step and checkpoint, is in faults.sh.)
. "$ROOT/tests/lib.sh"
A=$ASYNCPP

cat "$TESTDATA"/corpus/*.txt > plain.txt
$A tokenize train -q --vocab 400 -o t.tok --docs blank-line plain.txt
$A tokenize encode -q -t t.tok --val-fraction 0.1 -o sig --docs blank-line plain.txt
before=$(cat sig_train.shard sig_val.shard | md5sum)

# stop_encode SIGNAL PREFIX [--force]: encode from a FIFO that stays open,
# so the command is mid-way with its shards staged; send SIGNAL once they
# exist. Prints the exit status.
stop_encode() {
	local sig=$1 prefix=$2
	shift 2
	rm -f in.fifo
	mkfifo in.fifo
	$A tokenize encode -q -t t.tok --val-fraction 0.1 -o "$prefix" --docs blank-line "$@" \
		in.fifo 2> "$prefix.err" &
	local pid=$!
	exec 3<> in.fifo # read-write: never blocks, even if the command is gone
	timeout 20 cat plain.txt >&3
	for _ in $(seq 100); do
		ls | grep -q "^${prefix}_.*\.pass\." && break
		sleep 0.1
	done
	staged=$(ls | grep -c "^${prefix}_.*\.pass\.")
	kill -"$sig" "$pid"
	wait "$pid"
	echo $? > "$prefix.rc"
	exec 3>&-
}

stop_encode TERM sig --force
rc=$(cat sig.rc)
left=$(ls | grep '^sig_' | grep -v '^sig_\(train\|val\)\.shard$' | tr '\n' ' ')
if [ "$staged" -gt 0 ] && [ "$rc" -eq 143 ] && [ -z "$left" ] &&
   [ "$(cat sig_train.shard sig_val.shard | md5sum)" = "$before" ] &&
   grep -q "stopped by a signal; its unfinished output was removed" sig.err; then
	pass encode_sigterm_removes_staged_shards_keeps_old
else fail encode_sigterm_removes_staged_shards_keeps_old \
	"staged $staged, exit $rc, left: $left; $(head -c 300 sig.err)"; fi

stop_encode HUP fresh
rc=$(cat fresh.rc)
left=$(ls | grep '^fresh_' | tr '\n' ' ')
if [ "$staged" -gt 0 ] && [ "$rc" -eq 129 ] && [ -z "$left" ]; then
	pass encode_sighup_leaves_nothing
else fail encode_sighup_leaves_nothing "staged $staged, exit $rc, left: $left"; fi

# the same command left to finish writes the shards (the FIFO is not the cause)
rm -f in.fifo
mkfifo in.fifo
$A tokenize encode -q -t t.tok --val-fraction 0.1 -o whole --docs blank-line in.fifo &
pid=$!
timeout 20 cat plain.txt > in.fifo # (timeout: the command may be gone)
wait "$pid"
rc=$?
if [ "$rc" -eq 0 ] && [ -s whole_train.shard ] && [ -s whole_val.shard ] &&
   [ -z "$(ls | grep '^whole_.*\.\(pass\|split\|tmp\)\.')" ]; then
	pass encode_from_fifo_unstopped_completes
else fail encode_from_fifo_unstopped_completes "exit $rc: $(ls | grep '^whole_' | tr '\n' ' ')"; fi

# an export that fails takes away the folder it made
$A export --format hf --no-tokenizer -o made missing.ckpt 2> export.err
rc=$?
if [ "$rc" -eq 1 ] && [ ! -e made ] && grep -q "missing.ckpt" export.err; then
	pass export_failure_removes_the_folder_it_made
else fail export_failure_removes_the_folder_it_made "exit $rc, made: $(ls -d made 2>&1)"; fi
