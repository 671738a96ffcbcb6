#!/usr/bin/env bash
# hf_roundtrip.sh - `asyncpp import-hf` and `asyncpp export --format hf`
# through the command line, on the fixtures of testdata/hf:
#   - import, export (f32), import again: the same checkpoint tensors (inspect
#     --diff) and the same tokenizer file, byte for byte;
#   - bf16 / f16 exports of weights those types hold re-import exactly;
#   - the exported GPT-2 tensors are the hub file's, under HF's names
#     ("transformer." prefix added), checked by Python's json/struct;
#   - an export refuses a non-empty folder without --force;
#   - train --resume accepts an imported checkpoint (one step); sample
#     finds its tokenizer.
. "$ROOT/tests/lib.sh"
HF=$TESTDATA/hf

same_ckpt() { # NAME A B
	if "$ASYNCPP" inspect --diff "$2" "$3" > diff.txt 2>&1 &&
	   grep -q "tensors compared, \([0-9]*\) identical, 0 not comparable" diff.txt &&
	   [ "$(sed -n 's/^\([0-9]*\) tensors compared, \([0-9]*\) identical.*/\1 \2/p' diff.txt |
	       awk '{ print ($1 == $2) }')" = 1 ]; then
		pass "$1"
	else
		fail "$1" "$(head -c 300 diff.txt)"
	fi
}

for m in gpt2 llama llama-tied; do
	if ! "$ASYNCPP" import-hf -o $m.ckpt "$HF/$m" > out.txt 2> err.txt; then
		fail "import_hf_$m" "$(cat err.txt)"
		continue
	fi
	pass "import_hf_$m"
	if "$ASYNCPP" export --format hf -o $m-f32 $m.ckpt > out.txt 2> err.txt &&
	   "$ASYNCPP" import-hf -o $m-back.ckpt $m-f32 > out.txt 2>> err.txt; then
		same_ckpt "f32_round_trip_$m" $m.ckpt $m-back.ckpt
		if cmp -s $m.tok $m-back.tok; then pass "tokenizer_round_trip_$m"; else
			fail "tokenizer_round_trip_$m" "the tokenizer files differ"; fi
	else
		fail "f32_round_trip_$m" "$(cat err.txt)"
	fi
done

# the fixtures hold bf16 (llama) and f16 (llama-tied) values
for pair in llama:bf16 llama-tied:f16; do
	m=${pair%:*} t=${pair#*:}
	if "$ASYNCPP" export --format hf --dtype $t -o $m-$t $m.ckpt > out.txt 2> err.txt &&
	   grep -q "\"torch_dtype\": \"$( [ $t = bf16 ] && echo bfloat16 || echo float16)\"" $m-$t/config.json &&
	   "$ASYNCPP" import-hf -o $m-$t.ckpt $m-$t > out.txt 2>> err.txt; then
		same_ckpt "${t}_round_trip_$m" $m.ckpt $m-$t.ckpt
	else
		fail "${t}_round_trip_$m" "$(cat err.txt)"
	fi
done

# the export's GPT-2 tensors are the hub file's bytes under prefixed names
if ! command -v python3 > /dev/null; then
	skip export_matches_hub_tensors "python3 not found"
elif python3 - "$HF/gpt2/model.safetensors" gpt2-f32/model.safetensors > cmp.txt 2>&1 <<'PY'
import json, struct, sys
def load(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in h.items()}
hub, ours = load(sys.argv[1]), load(sys.argv[2])
want = {"transformer." + k: v for k, v in hub.items() if not k.endswith(".attn.bias")}
bad = sorted(set(want) ^ set(ours)) + [k for k in want if k in ours and want[k] != ours[k]]
print("differ:", bad[:5])
sys.exit(1 if bad else 0)
PY
then pass export_matches_hub_tensors; else fail export_matches_hub_tensors "$(head -c 300 cmp.txt)"; fi

for f in vocab.json merges.txt tokenizer.json tokenizer_config.json generation_config.json; do
	[ -s gpt2-f32/$f ] || { fail export_writes_hf_files "no $f"; break; }
done && pass export_writes_hf_files
if [ ! -e llama-f32/vocab.json ]; then pass llama_export_has_no_gpt2_vocab_files; else
	fail llama_export_has_no_gpt2_vocab_files "llama-f32/vocab.json written"; fi

expect_exit 1 export_refuses_non_empty_folder -- "$ASYNCPP" export --format hf -o gpt2-f32 gpt2.ckpt
if grep -q "'gpt2-f32' is not empty; pass --force" err.txt; then pass export_refusal_says_why; else
	fail export_refusal_says_why "$(cat err.txt)"; fi
expect_exit 0 export_force_overwrites -- "$ASYNCPP" export --format hf --force -o gpt2-f32 gpt2.ckpt

# an imported checkpoint trains on (its tokenizer is the data's) and samples
for i in $(seq 60); do printf 'the then thin tin the then in\n\n'; done > text.txt
if "$ASYNCPP" tokenize encode -q -t llama.tok --docs blank-line --val-fraction 0.2 -o data \
	text.txt > out.txt 2> err.txt &&
   "$ASYNCPP" train --resume llama.ckpt --set data.train=data_train.shard \
	--set data.val=data_val.shard --set train.steps=1 --set train.out_dir=run > out.txt 2>> err.txt; then
	pass train_resumes_from_import
else
	fail train_resumes_from_import "$(tail -n 2 err.txt | tr '\n' ' ')"
fi
expect_exit 0 sample_uses_imported_tokenizer -- "$ASYNCPP" sample -n 4 --prompt "the" gpt2.ckpt
