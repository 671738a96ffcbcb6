#!/usr/bin/env bash
# mpi_schedules.sh - the schedule sweep between processes: each kind (1f1b,
# gpipe, interleaved with 2 chunks per stage, zb-h1, zb-v, 2bw, 2bw-zb; the
# chunked ones up to S = 4, the model's 8 layers being 2S pieces) trained by
# `mpirun -np S asyncpp train` and, for the same
# configuration, in threads (`asyncpp train`), on the built-in corpus.
# One row per kind and transport: tokens/s over the steps after the first
# two (metrics.csv), the ratio to 1f1b's on the same transport, and the last
# step's loss, which the synchronous kinds must give exactly as 1f1b
# (marked; MISMATCH otherwise). bench train --sweep schedules (threads only,
# with the simulator's prediction) is the in-process counterpart.
#
# usage: bench/mpi_schedules.sh [ASYNCPP [S [STEPS]]]   (defaults:
# build-cpu/asyncpp, 2, 8); extra --set options in $SETS. Works in a
# temporary folder, removed afterwards.
set -u
A=$(realpath "${1:-build-cpu/asyncpp}")
S=${2:-2}
STEPS=${3:-8}
if ! command -v mpirun > /dev/null 2>&1; then
	echo "mpirun is not installed (apt-get install openmpi-bin libopenmpi-dev)" >&2
	exit 1
fi
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
cd "$DIR" || exit 1
case $S in
2 | 4 | 8) ;;
*) echo "S must be 2, 4 or 8 (the model's 8 layers split evenly)" >&2; exit 2 ;;
esac
# bench/NOTES.md's bench train --sweep schedules model: gpt2 L=8 d=128 T=128
# B=4 (the built-in tokenizer's vocabulary); M = 2S; one thread per stage
MODEL=(--set model.arch=gpt2 --set model.n_layer=8 --set model.d_model=128
       --set model.n_head=4 --set model.seq_len=128 --set train.batch_size=4
       --set train.threads=1 --set eval.every=0 --set log.every=1 --set checkpoint.every=0)
# shellcheck disable=SC2206
EXTRA=(${SETS:-})
if ! "$A" train -q "${MODEL[@]}" "${EXTRA[@]}" --set train.out_dir=base --set train.steps=1 \
	2> err.txt; then
	echo "preparing the built-in data failed: $(cat err.txt)" >&2
	exit 1
fi
RUN=("${MODEL[@]}" "${EXTRA[@]}" --set data.train=base/data/builtin_train.shard
     --set data.val=base/data/builtin_val.shard --set data.tokenizer=base/data/builtin.tok
     --set pipeline.stages="$S" --set pipeline.micro_batches=$((2 * S)) --set train.steps="$STEPS")
# yield when idle: the ranks may share cores
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1 -np "$S")

echo "S=$S M=$((2 * S)) L=8 d=128 T=128 B=4, $STEPS steps (tokens/s after step 2)," \
     "$(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg)"
printf '%-8s %-11s %9s %7s %12s\n' transport schedule tokens/s "x 1f1b" loss
for how in threads mpi; do
	ref_tps='' ref_loss=''
	for kind in 1f1b gpipe interleaved zb-h1 zb-v 2bw 2bw-zb; do
		out=run_${how}_$kind
		chunks=()
		case $kind in
		interleaved) chunks=(--set pipeline.virtual_stages=2) ;;
		esac
		case $kind in
		interleaved | zb-v) [ "$S" -le 4 ] || continue ;;
		esac
		if [ $how = mpi ]; then
			"${MPIRUN[@]}" "$A" train -q "${RUN[@]}" "${chunks[@]}" \
				--set train.schedule=$kind --set train.out_dir=$out > /dev/null 2> err.txt
		else
			"$A" train -q "${RUN[@]}" "${chunks[@]}" --set train.schedule=$kind \
				--set train.out_dir=$out > /dev/null 2> err.txt
		fi || { echo "$how $kind failed: $(head -c 400 err.txt)"; continue; }
		# tokens and wall seconds are columns 2 and 3, the loss 4
		read -r tps loss < <(awk -F, 'NR == 3 { n0 = $2; t0 = $3 }
			END { printf "%.0f %s\n", ($2 - n0) / ($3 - t0), $4 }' $out/metrics.csv)
		[ $kind = 1f1b ] && ref_tps=$tps ref_loss=$loss
		case $kind in
		2bw*) mark='(async)' ;;
		*) [ "$loss" = "$ref_loss" ] && mark='= 1f1b' || mark=MISMATCH ;;
		esac
		printf '%-8s %-11s %9s %7.3f %12s  %s\n' $how $kind "$tps" \
			"$(echo "$tps / $ref_tps" | bc -l)" "$loss" "$mark"
	done
done
echo "load after: $(cut -d' ' -f1 /proc/loadavg)"
