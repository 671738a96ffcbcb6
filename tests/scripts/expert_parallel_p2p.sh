#!/usr/bin/env bash
# expert_parallel_p2p.sh - model.expert_parallel = P between processes,
# the tokens' rows travelling to their experts' owner and back over p2p.h:
# under mpirun (4 ranks: 2 stages x 2 replicas with P = 2 under gpipe,
# 1f1b, 2bw, pipedream, zb-h1, 2bw-zb, and zb-v and interleaved (two pieces
# per rank, each exchanging in turn), 2bw with bf16 activations, 1f1b
# with experts left without tokens; 1 stage x 4 replicas with P = 2 and
# P = 4) and torchrun-style over TCP (1f1b and zb-h1, 2 x 2), every step's
# loss, gradient norm and router columns and every tensor of the final
# checkpoint are those of the same run in threads with P = 1; a
# P = 1 checkpoint resumes under MPI with P = 2 as the uninterrupted run.
# The same again with ASYNCPP_TEST_STAGE_HOST=1 (the cpu backend taken for
# a device backend: every carrier stages its messages through host
# buffers, as with cuda) under zb-v (a weight part; two pieces a rank),
# P = 4, bf16 and empty blocks over MPI, and 1f1b over TCP. A rank whose
# hook calls claim another weight version than its group's
# (ASYNCPP_FAULT=ep_version) ends the job, over MPI and TCP, with an error
# naming the ranks, the piece and both versions. Over TCP, rank 0's log
# gives the most its exchange holds (kept rows, scratch, accumulators, and
# host copies when staged) as computed by hand.
. "$ROOT/tests/lib.sh"
A=$ASYNCPP
export ASYNCPP_CONNECT_TIMEOUT=30
ep_setup ep_p2p_setup || exit 0
same() { ep_same "$@"; } # NAME RUN REF (lib.sh)
threads() { # OUT ARGS...: the P = 1 run in threads
	local out=$1
	shift
	$A train -q "${TINY[@]}" --set train.out_dir="$out" "$@" 2> err.txt
}

# ep_mismatch NAME ERRFILES...: a rank's message names the disagreement
# that ASYNCPP_FAULT=ep_version:2:1 made (1f1b: step 2 computes on version
# 1; rank 1 claims 2), whichever rank saw it first
ep_mismatch() {
	local name=$1 w="the forward of micro-batch 0 of step 2 on weight version"
	shift
	if grep -q -e "rank 1 (piece 0): its expert-parallel group disagrees on the work: this \
rank (replica 1) runs $w 2, rank 0 (replica 0) $w 1; a schedule bug" -e "rank 0 (piece 0): \
its expert-parallel group disagrees on the work: this rank (replica 0) runs $w 1, rank 1 \
(replica 1) $w 2; a schedule bug" "$@"; then
		pass "$name"
	else
		fail "$name" "$(cat "$@" | head -c 400)"
	fi
}

# 1. MPI
if ! command -v mpirun > /dev/null 2>&1; then
	skip ep_mpi "mpirun is not installed (apt-get install openmpi-bin libopenmpi-dev)"
else
	for spec in "gpipe 2 2 2" "1f1b 2 2 2" "2bw 2 2 2" "pipedream 2 2 2" "zb-h1 2 2 2" \
		    "2bw-zb 2 2 2" "1f1b 1 4 2" "1f1b 1 4 4" "2bw 2 2 2 bf16" "1f1b 2 2 2 f32 few" \
		    "zb-v 2 2 2" "interleaved 2 2 2"; do
		set -- $spec
		k=$1 S=$2 N=$3 P=$4 dt=${5:-f32}
		name=mpi_ep${P}_${k}_S${S}_dp${N}_$dt${6:+_$6}
		args=(--set train.schedule=$k --set pipeline.stages=$S --set pipeline.data_parallel=$N
		      --set pipeline.micro_batches=8 --set train.act_dtype=$dt)
		# the chunked kinds: two pieces of a layer on each rank
		case $k in
		zb-v) args+=(--set model.n_layer=4) ;;
		interleaved) args+=(--set model.n_layer=4 --set pipeline.virtual_stages=2) ;;
		esac
		# few: 8 tokens a micro-batch over 8 experts, top-1 (empty blocks)
		[ "${6:-}" = few ] && args+=(--set model.n_expert=8 --set model.top_k=1
					      --set model.seq_len=8 --set train.batch_size=1)
		if ! threads t-$name "${args[@]}"; then
			fail "$name" "threads: $(cat err.txt)"
		elif ! ep_mpi m-$name $P "${args[@]}"; then
			grep -q "built without MPI" err.txt &&
				{ skip ep_mpi "this asyncpp was built without MPI"; break; }
			fail "$name" "$(head -c 400 err.txt)"
		else
			same "$name" m-$name t-$name
		fi
	done
	# staged through host buffers (the device backends' path), against the
	# same threads runs
	for spec in "zb-v 2 2 2" "1f1b 1 4 4" "2bw 2 2 2 bf16" "1f1b 2 2 2 f32 few"; do
		set -- $spec
		k=$1 S=$2 N=$3 P=$4 dt=${5:-f32}
		name=mpi_ep${P}_${k}_S${S}_dp${N}_$dt${6:+_$6}
		args=(--set train.schedule=$k --set pipeline.stages=$S --set pipeline.data_parallel=$N
		      --set pipeline.micro_batches=8 --set train.act_dtype=$dt)
		[ $k = zb-v ] && args+=(--set model.n_layer=4)
		[ "${6:-}" = few ] && args+=(--set model.n_expert=8 --set model.top_k=1
					      --set model.seq_len=8 --set train.batch_size=1)
		[ -f t-$name/ckpt-00000004.ckpt ] || continue
		if ! ASYNCPP_TEST_STAGE_HOST=1 ep_mpi s-$name $P "${args[@]}"; then
			fail "staged_$name" "$(head -c 400 err.txt)"
		else
			same "staged_$name" s-$name t-$name
		fi
	done
	# resume: a P = 1 checkpoint of threads, under MPI with P = 2
	src=t-mpi_ep2_1f1b_S2_dp2_f32
	if [ -f $src/ckpt-00000002.ckpt ]; then
		mkdir -p res
		cp $src/ckpt-00000002.ckpt res/
		if ep_mpi res 2 --set train.schedule=1f1b --set pipeline.stages=2 \
			--set pipeline.micro_batches=8 --resume res/ckpt-00000002.ckpt &&
		   diff <(ep_cols $src/metrics.csv | sed -n 3,4p) <(ep_cols res/metrics.csv) > d.txt &&
		   $A inspect --diff $src/ckpt-00000004.ckpt res/ckpt-00000004.ckpt > d.txt 2>&1 &&
		   head -n 1 d.txt | grep -q '^identical: '; then
			pass mpi_resume_ep1_as_ep2
		else
			fail mpi_resume_ep1_as_ep2 "$(cat err.txt d.txt | head -n 6 | tr '\n' ' ')"
		fi
	fi
	# a rank on another weight version than its group's
	ASYNCPP_FAULT=ep_version:2:1 timeout 120 "${EP_MPIRUN[@]:0:6}" -np 2 $A train -q \
		"${TINY[@]}" --set train.schedule=1f1b --set pipeline.stages=1 \
		--set model.expert_parallel=2 --set train.out_dir=vm > out.txt 2> err.txt
	rc=$?
	if [ $rc != 0 ] && [ ! -e vm/ckpt-00000002.ckpt ]; then
		ep_mismatch mpi_ep_version_mismatch err.txt
	else
		fail mpi_ep_version_mismatch "exit $rc: $(head -c 400 err.txt)"
	fi
fi

# 2. TCP, torchrun-style (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
launch() { tcp_launch "$1" 120 "${@:2}"; } # N ARGS... (lib.sh)
for kind in 1f1b zb-h1 staged-1f1b; do
	k=${kind#staged-}
	name=tcp_ep2_${k}_S2_dp2
	args=(--set train.schedule=$k --set pipeline.stages=2)
	stage=0
	[ $kind = $k ] || { stage=1; name=staged_$name; }
	if ! threads t-$name "${args[@]}"; then
		fail "$name" "threads: $(cat err.txt)"
		continue
	fi
	ASYNCPP_TEST_STAGE_HOST=$stage launch 4 "${TINY[@]}" "${args[@]}" \
		--set pipeline.transport=tcp --set model.expert_parallel=2 --set train.out_dir=c-$name
	if [ "$rcs" != "0 0 0 0" ]; then
		fail "$name" "exit statuses $rcs: $(head -c 400 err0.txt)"
	else
		rm -f err[0-9].txt
		same "$name" c-$name t-$name
	fi
done
ASYNCPP_FAULT=ep_version:2:1 launch 2 "${TINY[@]}" --set train.schedule=1f1b \
	--set pipeline.stages=1 --set pipeline.transport=tcp --set model.expert_parallel=2 \
	--set train.out_dir=vt
if [ "$rcs" = "1 1" ] && [ ! -e vt/ckpt-00000002.ckpt ]; then
	ep_mismatch tcp_ep_version_mismatch err0.txt err1.txt
else
	fail tcp_ep_version_mismatch "exit statuses $rcs: $(cat err0.txt err1.txt | head -c 400)"
fi

# The exchange's memory on rank 0 (stage 0 of 2, 1 of the 2 layers), by
# hand: 4 x 64 = 256 tokens a micro-batch, C = De = 128, top-2 of 4
# experts, P = 2: at most 512 rows of the other member at an owner; a kept
# row (xd, h, act, dy, dh) 2C + 5De = 896 floats, a scratch row (y, dact,
# dxd) 2C + De = 384; 1f1b's stage 0 of 2 has 2 micro-batches in flight;
# an accumulator [P][G] of 3 De C floats per layer and arena (2). Staged
# through host memory: the member's 512 rows out and back (2C each), one
# block's copy, deliver's two copies of the [P][G] fcw (2 De C each).
mb() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1e6 }'; }
MEM=(--set model.d_model=128 --set model.d_expert=128 --set model.seq_len=64
     --set model.shared_expert=0 --set train.schedule=1f1b --set pipeline.stages=2
     --set pipeline.split=even --set pipeline.transport=tcp --set model.expert_parallel=2
     --set train.steps=0)
kept=$((1 * 1 * 2 * 512 * 896 * 4)) scratch=$((512 * 384 * 4))
acc=$((2 * 1 * 2 * 2 * 3 * 128 * 128 * 4))
staging=$((512 * 256 * 4 + 512 * 256 * 4 + 2 * 2 * 2 * 2 * 128 * 128 * 4))
for host in 0 1; do
	name=tcp_ep_memory$([ $host = 1 ] && echo _staged)
	p=$(free_port)
	for ((r = 3; r >= 0; r--)); do # not -q: rank 0 logs
		ASYNCPP_TEST_STAGE_HOST=$host MASTER_ADDR=127.0.0.1 MASTER_PORT=$p RANK=$r \
			WORLD_SIZE=4 LOCAL_RANK=$r timeout 60 $A train "${TINY[@]}" "${MEM[@]}" \
			--set train.out_dir=mem$host > out$r.txt 2> err$r.txt &
	done
	wait
	total=$((kept + scratch + acc)) copies=""
	[ $host = 1 ] && total=$((total + staging)) copies=", host copies $(mb $staging) MB"
	if grep -qx "asyncpp: expert exchange: at most $(mb $total) MB on rank 0 (the owners' \
kept rows $(mb $kept) MB, scratch $(mb $scratch) MB, gradient accumulators $(mb $acc) \
MB$copies)" err0.txt; then
		pass $name
	else
		fail $name "$(grep -h 'expert' err*.txt | head -c 400) (wanted $(mb $total) MB)"
	fi
done
