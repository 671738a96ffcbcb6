#!/usr/bin/env bash
# moe_cli.sh - a mixture-of-experts llama end to end: the metrics file has
# the router's columns (expert_tokens adding up to L x K x tokens) in CSV
# and JSON lines, and plot reads them; a run resumed from its checkpoint
# gives the same rows; inspect lists every expert tensor with its shape;
# export writes them to safetensors under their names and shapes, and
# --format hf refuses the shared expert by name; eval and sample work; train.device = cuda
# takes an MoE model as it takes a dense one; a 2-process MPI pipeline equals the same one
# in threads.
. "$ROOT/tests/lib.sh"
A=$ASYNCPP
# 2 layers of 4 experts (width 48, top-2, a shared expert) on 2 micro-batches
TINY=(--set model.n_layer=2 --set model.d_model=32 --set model.n_head=2 --set model.seq_len=32
      --set model.n_expert=4 --set model.top_k=2 --set model.d_expert=48
      --set model.shared_expert=1 --set train.batch_size=4 --set pipeline.micro_batches=2
      --set log.every=2 --set eval.every=0 --set train.threads=1)
TOKENS_PER_STEP=$((2 * 2 * 2 * 4 * 32)) # L * K * M * B * T

if ! $A train -q "${TINY[@]}" --set train.out_dir=full --set train.steps=6 \
	--set checkpoint.every=3 2> err.txt; then
	fail moe_trains "$(cat err.txt)"
	exit 0
fi
pass moe_trains
DATA=(--set data.train=full/data/builtin_train.shard --set data.val=full/data/builtin_val.shard
      --set data.tokenizer=full/data/builtin.tok)

# 1. the metrics: the MoE columns after time, every step's counts adding up
head -n 1 full/metrics.csv > header.txt
if grep -q ',time,moe_balance,moe_z,expert_tokens$' header.txt &&
   awk -F, -v want=$TOKENS_PER_STEP 'NR > 1 {
	n = split($15, c, " "); s = 0; for (i = 1; i <= n; i++) s += c[i]
	if (n != 4 || s != want || !($13 > 0) || !($14 > 0)) bad = bad " " $1
	rows++ } END { exit (bad != "" || rows != 6) }' full/metrics.csv; then
	pass metrics_expert_columns
else
	fail metrics_expert_columns "$(cat header.txt; sed -n 2,3p full/metrics.csv)"
fi
if $A train -q "${TINY[@]}" "${DATA[@]}" --set train.out_dir=json --set train.steps=2 \
	--set log.format=jsonl 2> err.txt &&
   grep -Eq '"moe_balance": [0-9.e+-]+, "moe_z": [0-9.e+-]+, "expert_tokens": \[[0-9]+, [0-9]+, [0-9]+, [0-9]+\]\}$' \
	json/metrics.jsonl &&
   $A plot --y moe_balance -o b.svg full/metrics.csv json/metrics.jsonl 2> err.txt &&
   $A plot --y moe_z -o z.svg json/metrics.jsonl 2>> err.txt && grep -q '<path' b.svg; then
	pass metrics_jsonl_and_plot
else
	fail metrics_jsonl_and_plot "$(cat err.txt; head -n 1 json/metrics.jsonl)"
fi

# 2. resume from step 3: the same rows (losses, router columns) for 4..6
# and the same tensors at step 6 (the stored configurations differ: out_dir)
cols() { awk -F, 'NR > 1 && $4 != "" {print $1, $4, $7, $13, $14, $15}' "$1"; }
mkdir -p part
cp full/ckpt-00000003.ckpt part/
if $A train -q "${TINY[@]}" "${DATA[@]}" --set train.out_dir=part --set train.steps=6 \
	--resume part/ckpt-00000003.ckpt 2> err.txt &&
   diff <(cols full/metrics.csv | sed -n 4,6p) <(cols part/metrics.csv) > d.txt &&
   $A inspect --diff full/ckpt-00000006.ckpt part/ckpt-00000006.ckpt > d.txt 2>&1 &&
   grep -Eq '^([0-9]+) tensors compared, \1 identical, 0 not comparable' d.txt; then
	pass resume_exact
else
	fail resume_exact "$(cat err.txt d.txt | head -n 8 | tr '\n' ' ')"
fi

# 3. inspect: the router and every expert, with their shapes
CK=full/ckpt-00000006.ckpt
if $A inspect $CK > insp.txt 2> err.txt &&
   grep -Eq '^weights\.v0/h\.1\.router +4x32 ' insp.txt &&
   grep -Eq '^weights\.v0/h\.0\.experts\.3\.fcw +96x32 ' insp.txt &&
   grep -Eq '^weights\.v0/h\.1\.experts\.0\.fcprojw +32x48 ' insp.txt &&
   grep -Eq '^weights\.v0/h\.1\.shared\.fcprojw +32x48 ' insp.txt &&
   [ "$(grep -c '^weights\.v0/h\.[01]\.experts\.[0-3]\.fc' insp.txt)" -eq 16 ]; then
	pass inspect_lists_experts
else
	fail inspect_lists_experts "$(cat err.txt; grep -m 4 experts insp.txt)"
fi

# 4. export: safetensors holds the experts under our names; hf refuses
if $A export -o m.safetensors $CK 2> err.txt; then
	if command -v python3 > /dev/null; then
		python3 - m.safetensors > st.txt 2>&1 <<'EOF'
import json, struct, sys
f = open(sys.argv[1], 'rb')
n = struct.unpack('<Q', f.read(8))[0]
h = json.loads(f.read(n))
meta = h.pop('__metadata__')
assert meta['n_expert'] == '4' and meta['top_k'] == '2' and meta['d_expert'] == '48', meta
assert meta['shared_expert'] == '1' and meta['router'] == 'softmax', meta
assert h['h.0.router']['shape'] == [4, 32], h['h.0.router']
for l in range(2):
    for e in range(4):
        assert h['h.%d.experts.%d.fcw' % (l, e)]['shape'] == [96, 32]
        assert h['h.%d.experts.%d.fcprojw' % (l, e)]['shape'] == [32, 48]
    assert h['h.%d.shared.fcw' % l]['shape'] == [96, 32]
assert not any(k.endswith('.fcw') and 'expert' not in k and 'shared' not in k for k in h), h.keys()
print('ok')
EOF
		if grep -qx ok st.txt; then pass export_safetensors_experts; else
			fail export_safetensors_experts "$(cat st.txt)"; fi
	else
		skip export_safetensors_experts "python3 is needed to read the header"
	fi
else
	fail export_safetensors_experts "$(cat err.txt)"
fi
$A export --format hf -o hf $CK > out.txt 2> err.txt
rc=$?
if [ $rc -eq 1 ] && grep -q 'model.shared_expert = 1 has no Mixtral layout' err.txt &&
   grep -q -- '--format safetensors' err.txt; then
	pass export_hf_refuses_moe
else
	fail export_hf_refuses_moe "exit $rc: $(cat err.txt)"
fi

# 5. eval and sample read the checkpoint
if $A eval $CK > ev.txt 2> err.txt && grep -q '^perplexity' ev.txt &&
   $A sample $CK --prompt "The" -n 8 --seed 2 > s.txt 2> err.txt && [ -s s.txt ]; then
	pass eval_and_sample
else
	fail eval_and_sample "$(cat err.txt)"
fi

# 6. CUDA takes an MoE model as it takes a dense one: both train (a GPU), or
#    both fail with the one device message (no GPU, or no CUDA in this build)
$A train -q "${TINY[@]}" "${DATA[@]}" --set train.out_dir=gpu --set train.device=cuda \
	--set train.steps=1 > out.txt 2> err.txt
rc=$?
rm -rf gpu
$A train -q "${TINY[@]}" "${DATA[@]}" --set model.n_expert=0 --set train.out_dir=gpu \
	--set train.device=cuda --set train.steps=1 > out.txt 2> err_dense.txt
rc_dense=$?
if [ $rc -eq $rc_dense ] && cmp -s err.txt err_dense.txt && ! grep -q 'expert' err.txt; then
	pass cuda_takes_moe
else
	fail cuda_takes_moe "exit $rc (dense: $rc_dense): $(cat err.txt) | dense: $(cat err_dense.txt)"
fi

# 7. MPI: 2bw over 2 processes equals 2bw in threads, router columns too
if ! command -v mpirun > /dev/null 2>&1; then
	skip mpi_moe "mpirun is not installed"
	exit 0
fi
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1 -np 2)
RUN=("${TINY[@]}" "${DATA[@]}" --set train.schedule=2bw --set pipeline.stages=2
     --set train.steps=6 --set checkpoint.every=6)
if ! $A train -q "${RUN[@]}" --set train.out_dir=run 2> err.txt; then
	fail mpi_moe "threaded run: $(cat err.txt)"
	exit 0
fi
mv run threads
"${MPIRUN[@]}" $A train -q "${RUN[@]}" --set train.out_dir=run > mpi.out 2> err.txt
rc=$?
if grep -q "built without MPI" err.txt; then
	skip mpi_moe "this asyncpp was built without MPI"
	exit 0
fi
if [ $rc -eq 0 ] && diff <(cols threads/metrics.csv) <(cols run/metrics.csv) > d.txt &&
   [ "$(cols run/metrics.csv | wc -l)" -eq 6 ] &&
   same_ckpt threads/ckpt-00000006.ckpt run/ckpt-00000006.ckpt; then
	pass mpi_moe_equals_threads
else
	fail mpi_moe_equals_threads "exit $rc: $(cat err.txt d.txt | head -n 8 | tr '\n' ' ')"
fi
