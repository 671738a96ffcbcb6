#!/usr/bin/env bash
# expert_parallel.sh - model.expert_parallel = P splits each MoE layer's
# experts over P data-parallel replicas (threads), and the run is the run
# of P = 1 bit for bit: every step's loss, gradient norm and router
# columns, and every tensor of the final checkpoint, under every schedule
# on 1 and 2 stages, with 2 and 4 replicas (P = 2 and 4), a top-1 sigmoid
# router on 8 experts, experts left without tokens, top_k = E and bf16
# activations; a checkpoint written with P = 2
# resumes with P = 1 and one written with P = 1 with P = 2, each the
# uninterrupted run's bits. What does not run (train.schedule = none) is
# refused naming the key, writing nothing; pipeline.transport = nccl is
# no longer refused for P > 1: in one process it meets the launcher's
# message of P = 1 (it needs GPU processes; experts_nccl.c). The memory
# of the exchange: none of its own in threads (train's log says so), and
# bench train's "expert exchange" row gives what one process a stage
# would hold, as computed by hand.
# Between processes: expert_parallel_p2p.sh.
. "$ROOT/tests/lib.sh"
A=$ASYNCPP
# 2 layers of 4 experts (width 48, top-2, a shared expert), 2 replicas
ep_setup ep_setup || exit 0
same() { ep_same "$@"; } # NAME RUN REF (lib.sh)
# run NAME P ARGS...: train into NAME with model.expert_parallel = P
run() {
	local out=$1 P=$2
	shift 2
	$A train -q "${TINY[@]}" --set train.out_dir="$out" --set model.expert_parallel="$P" "$@" \
		2> err.txt
}

# 1. every schedule, 2 stages (zb-v: 2 chunks per stage need 4 micro-batches
# per replica), and the ones of 1 stage, 2 replicas
for k in gpipe 1f1b 2bw pipedream interleaved zb-h1 zb-v 2bw-zb; do
	for S in 1 2; do
		[ $S -eq 1 ] && case $k in interleaved|zb-v|pipedream) continue;; esac
		args=(--set train.schedule=$k --set pipeline.stages=$S)
		[ $k = zb-v ] && args+=(--set pipeline.micro_batches=8)
		if run $k-$S-p1 1 "${args[@]}" && run $k-$S-p2 2 "${args[@]}"; then
			same "ep2_equals_ep1_${k}_S$S" $k-$S-p2 $k-$S-p1
		else
			fail "ep2_equals_ep1_${k}_S$S" "$(cat err.txt)"
		fi
	done
done

# 2. 4 replicas: P = 2 (two groups) and P = 4 (one) against P = 1
args=(--set pipeline.data_parallel=4 --set pipeline.micro_batches=8 --set train.schedule=1f1b
      --set pipeline.stages=2)
if run dp4-p1 1 "${args[@]}" && run dp4-p2 2 "${args[@]}" && run dp4-p4 4 "${args[@]}"; then
	same ep2_of_4_replicas dp4-p2 dp4-p1
	same ep4_of_4_replicas dp4-p4 dp4-p1
else
	fail ep_4_replicas "$(cat err.txt)"
fi

# 3. 8 experts, top-1 sigmoid router without a shared expert, P = 2; bf16
args=(--set model.n_expert=8 --set model.top_k=1 --set model.router=sigmoid
      --set model.shared_expert=0 --set train.schedule=2bw --set pipeline.stages=2)
if run sig-p1 1 "${args[@]}" && run sig-p2 2 "${args[@]}"; then
	same ep2_top1_sigmoid sig-p2 sig-p1
else
	fail ep2_top1_sigmoid "$(cat err.txt)"
fi
args=(--set train.act_dtype=bf16 --set train.schedule=zb-h1 --set pipeline.stages=2)
if run bf-p1 1 "${args[@]}" && run bf-p2 2 "${args[@]}"; then
	same ep2_bf16 bf-p2 bf-p1
else
	fail ep2_bf16 "$(cat err.txt)"
fi

# 3b. experts that get no token in a micro-batch (8 tokens a micro-batch,
# 8 experts, top-1: P owners see empty blocks) and top_k = E (every expert
# gets every token)
few=(--set model.n_expert=8 --set model.top_k=1 --set model.seq_len=8 --set train.batch_size=1
     --set train.schedule=1f1b --set pipeline.stages=2)
all=(--set model.top_k=4 --set train.batch_size=2 --set pipeline.micro_batches=2
     --set train.schedule=1f1b --set pipeline.stages=2)
if run few-p1 1 "${few[@]}" && run few-p2 2 "${few[@]}"; then
	same ep2_empty_experts few-p2 few-p1
else
	fail ep2_empty_experts "$(cat err.txt)"
fi
if run all-p1 1 "${all[@]}" && run all-p2 2 "${all[@]}"; then
	same ep2_top_k_is_E all-p2 all-p1
else
	fail ep2_top_k_is_E "$(cat err.txt)"
fi

# 4. resume across P: step 2's checkpoint of a P = 2 run resumed with P = 1,
# and of a P = 1 run with P = 2, end as the uninterrupted runs (1f1b, S = 2)
for pair in "2 1" "1 2"; do
	set -- $pair
	mkdir -p res-$1-$2
	cp 1f1b-2-p$1/ckpt-00000002.ckpt res-$1-$2/
	if run res-$1-$2 $2 --set train.schedule=1f1b --set pipeline.stages=2 \
		--resume res-$1-$2/ckpt-00000002.ckpt &&
	   diff <(ep_cols 1f1b-2-p$1/metrics.csv | sed -n 3,4p) <(ep_cols res-$1-$2/metrics.csv) > d.txt &&
	   $A inspect --diff 1f1b-2-p$1/ckpt-00000004.ckpt res-$1-$2/ckpt-00000004.ckpt > d.txt 2>&1 &&
	   head -n 1 d.txt | grep -q '^identical: '; then
		pass "resume_ep$1_as_ep$2"
	else
		fail "resume_ep$1_as_ep$2" "$(cat err.txt d.txt | head -n 6 | tr '\n' ' ')"
	fi
done

# 5. refused, naming the key: schedule none, another transport
expect_exit 1 ep_schedule_none_refused -- run none 2 --set train.schedule=none
grep -q 'model.expert_parallel = 2 needs a pipeline schedule' err.txt ||
	fail ep_schedule_none_message "$(cat err.txt)"
if [ -e none ]; then fail ep_refused_wrote "a refused run left its out_dir"; fi
# nccl: the same refusal as P = 1 (one process), not expert parallelism's
run nccl1 1 --set train.schedule=gpipe --set pipeline.transport=nccl
mv err.txt err1.txt
expect_exit 1 ep_nccl_as_ep1 -- run nccl 2 --set train.schedule=gpipe --set pipeline.transport=nccl
if grep -q 'expert_parallel' err.txt || ! grep -q 'pipeline.transport = nccl' err.txt ||
   ! diff err1.txt err.txt > /dev/null; then
	fail ep_nccl_message "$(cat err.txt)"
fi

# 6. the exchange's memory. By hand: 4 x 64 = 256 tokens a micro-batch,
# C = De = 128, top-2 of 4 experts, P = 2: an owner's G = 2 experts take at
# most 256 x 2 = 512 rows of the other member; a kept row (xd, h, act, dy,
# dh) is 2C + 5De = 896 floats, a scratch row (y, dact, dxd) 2C + De = 384;
# one expert's gradients 3 De C floats, an accumulator [P][G] of them per
# layer and gradient arena (2: 1f1b overlaps steps). One stage of 2
# layers under 1f1b has 1 micro-batch in flight.
mb() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1e6 }'; }
kept=$((1 * 2 * 1 * 512 * 896 * 4)) scratch=$((512 * 384 * 4))
acc=$((2 * 2 * 2 * 2 * 3 * 128 * 128 * 4))
want="  expert exchange       0.0 MB  (threads: none of its own; a process per stage would hold \
$(mb $((kept + scratch + acc))) MB: kept rows $(mb $kept), scratch $(mb $scratch), accumulators \
$(mb $acc))"
MEM=(--set model.d_model=128 --set model.d_expert=128 --set model.seq_len=64
     --set model.shared_expert=0 --set model.vocab_size=512 --set train.schedule=1f1b
     --set model.expert_parallel=2)
if ! $A bench train -j 1 --steps 1 --warmup 0 "${TINY[@]}" "${MEM[@]}" > out.txt 2> err.txt; then
	fail ep_bench_memory "$(cat err.txt)"
elif [ "$(grep '^  expert exchange' out.txt)" != "$want" ]; then
	fail ep_bench_memory "$(grep -A9 '^memory' out.txt) (wanted: $want)"
else
	pass ep_bench_memory
fi
$A train "${TINY[@]}" "${MEM[@]}" --set train.steps=0 --set train.out_dir=mem > out.txt 2> err.txt
if grep -qx "asyncpp: expert exchange: in threads it holds nothing of its own (the owners \
compute in the members' buffers)" err.txt; then
	pass ep_train_memory_threads
else
	fail ep_train_memory_threads "$(cat err.txt)"
fi
