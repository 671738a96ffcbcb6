#!/usr/bin/env bash
# hf_mixtral.sh - a mixture of experts to and from Hugging Face's Mixtral
# layout (MixtralForCausalLM) through the command line:
#   - testdata/hf/mixtral imports, exports (f32) and imports again to the
#     same tensors, bit for bit, and the same tokenizer file;
#   - the exported tensors are the fixture's bytes under the same names
#     (block_sparse_moe.gate, experts.M.w1/w2/w3), checked by Python;
#   - a model asyncpp trained (top-2, softmax) exports and imports back to
#     its own weights, bit for bit, and evaluates to the same loss;
#   - the imported configuration is Mixtral's objective: aux_loss_coef from
#     router_aux_loss_coef, no z-loss, softmax, no shared expert.
# (test_hf.c checks the logits against a Mixtral forward in Python's maths;
# tests/cli/export-hf-moe-* the refusals.)
. "$ROOT/tests/lib.sh"
A=$ASYNCPP

# every weight tensor of A compared with B's and identical (the optimizer
# state a trained checkpoint holds besides is not comparable)
same_tensors() { # NAME A B
	local n
	n=$($A inspect "$2" 2> /dev/null | grep -c '^weights\.v0/')
	if $A inspect --diff "$2" "$3" > diff.txt 2>&1 &&
	   grep -q "^$n tensors compared, $n identical" diff.txt && [ "$n" -gt 0 ]; then
		pass "$1"
	else
		fail "$1" "$(tail -c 300 diff.txt)"
	fi
}

if $A import-hf -o mix.ckpt "$TESTDATA/hf/mixtral" > out.txt 2> err.txt &&
   $A export --format hf -o mix-f32 mix.ckpt > out.txt 2>> err.txt &&
   $A import-hf -o mix-back.ckpt mix-f32 > out.txt 2>> err.txt; then
	same_tensors mixtral_round_trip mix.ckpt mix-back.ckpt
	if cmp -s mix.tok mix-back.tok; then pass mixtral_tokenizer_round_trip; else
		fail mixtral_tokenizer_round_trip "the tokenizer files differ"; fi
else
	fail mixtral_round_trip "$(cat err.txt)"
fi

if $A inspect -v mix.ckpt > cfg.txt 2>&1 &&
   grep -qx 'n_expert = 4' cfg.txt && grep -qx 'top_k = 2' cfg.txt &&
   grep -qx 'd_expert = 12' cfg.txt && grep -qx 'shared_expert = 0' cfg.txt &&
   grep -qx 'router = softmax' cfg.txt && grep -qx 'aux_loss_coef = 0.0199999996' cfg.txt &&
   grep -qx 'z_loss_coef = 0' cfg.txt; then
	pass mixtral_import_configuration
else
	fail mixtral_import_configuration "$(grep -E 'expert|top_k|router|coef' cfg.txt)"
fi

if ! command -v python3 > /dev/null; then
	skip mixtral_export_matches_fixture "python3 not found"
elif python3 - "$TESTDATA/hf/mixtral/model.safetensors" mix-f32/model.safetensors > cmp.txt 2>&1 <<'PY'
import json, struct, sys
def load(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in h.items()}
hub, ours = load(sys.argv[1]), load(sys.argv[2])
bad = sorted(set(hub) ^ set(ours)) + [k for k in hub if k in ours and hub[k] != ours[k]]
print("differ:", bad[:5], len(hub))
sys.exit(1 if bad or "model.layers.1.block_sparse_moe.experts.3.w3.weight" not in ours else 0)
PY
then pass mixtral_export_matches_fixture; else
	fail mixtral_export_matches_fixture "$(head -c 300 cmp.txt)"; fi

# a model trained here: top-2 of 4 experts, grouped-query attention, untied
TINY=(--set model.n_layer=2 --set model.d_model=32 --set model.n_head=2 --set model.n_kv_head=1
      --set model.seq_len=32 --set model.n_expert=4 --set model.top_k=2 --set model.d_expert=24
      --set model.tied=0 --set model.aux_loss_coef=0.03 --set train.batch_size=4
      --set train.steps=3 --set eval.every=0 --set train.threads=1 --set train.out_dir=run)
if $A train -q "${TINY[@]}" 2> err.txt &&
   $A export --format hf -o trained run/ckpt-00000003.ckpt > out.txt 2>> err.txt &&
   grep -q '"router_aux_loss_coef": 0.03,' trained/config.json &&
   $A import-hf -o trained.ckpt trained > out.txt 2>> err.txt; then
	same_tensors trained_moe_round_trip run/ckpt-00000003.ckpt trained.ckpt
	EV=(--data run/data/builtin_val.shard --batches 4 --batch-size 4)
	if $A eval "${EV[@]}" run/ckpt-00000003.ckpt > a.txt 2> err.txt &&
	   # the re-imported tokenizer splits added tokens out of the text as
	   # HF's does (a flag the built-in one lacks), so its hash differs;
	   # the shard holds no special-token text, so --force says the ids agree
	   $A eval --force "${EV[@]}" trained.ckpt > b.txt 2>> err.txt &&
	   diff <(grep -E '^(loss|perplexity)' a.txt) <(grep -E '^(loss|perplexity)' b.txt) > /dev/null &&
	   grep -q '^loss' a.txt; then
		pass trained_moe_evaluates_the_same
	else
		fail trained_moe_evaluates_the_same "$(cat err.txt a.txt b.txt | head -c 400)"
	fi
else
	fail trained_moe_round_trip "$(cat err.txt)"
fi

# model.expert_parallel is how the experts are spread, not the model: a
# checkpoint written with 2 (import-hf stores what --set says) resumes with 1
for i in $(seq 60); do printf 'the then thin tin the then in\n\n'; done > text.txt
if $A import-hf -o ep2.ckpt --set model.expert_parallel=2 "$TESTDATA/hf/mixtral" > out.txt 2> err.txt &&
   $A tokenize encode -q -t ep2.tok --docs blank-line --val-fraction 0.2 -o data text.txt \
	> out.txt 2>> err.txt &&
   $A train -q --resume ep2.ckpt --set model.expert_parallel=1 --set data.train=data_train.shard \
	--set data.val=data_val.shard --set train.steps=1 \
	--set train.out_dir=ep1 > out.txt 2>> err.txt && [ -e ep1/ckpt-00000001.ckpt ]; then
	pass resume_changes_expert_parallel
else
	fail resume_changes_expert_parallel "$(tail -n 2 err.txt | tr '\n' ' ')"
fi
