#!/usr/bin/env bash
# demo.sh - what `make demo` runs: the main job on the built-in corpus.
#   1. tokenize: train a BPE tokenizer on testdata/corpus, encode train/val shards
#   2. train: a tiny llama on two pipeline stages under PipeDream-2BW
#   3. eval: loss and perplexity on the validation shard
#   4. sample: a continuation of a prompt
set -euo pipefail
cd "$(dirname "$0")/.."
A=${ASYNCPP:-./asyncpp}
OUT=${DEMO_DIR:-runs/demo}
mkdir -p "$OUT"
step() { printf '\n== %s\n$' "$1"; printf ' %q' "${@:2}"; printf '\n'; "${@:2}"; }

step "1. tokenize the built-in corpus" \
	"$A" tokenize train --vocab 512 -o "$OUT/demo.tok" testdata/corpus/*.txt
step "   encode it into train/val shards" \
	"$A" tokenize encode -t "$OUT/demo.tok" -o "$OUT/demo" --docs blank-line --val-fraction 0.1 \
	testdata/corpus/*.txt
step "   inspect the training shard" "$A" inspect "$OUT/demo_train.shard"
step "2. train: 2 pipeline stages, PipeDream-2BW, AdamW" \
	"$A" train --overwrite --set train.out_dir="$OUT" \
	--set data.train="$OUT/demo_train.shard" --set data.val="$OUT/demo_val.shard" \
	--set data.tokenizer="$OUT/demo.tok" \
	--set train.schedule=2bw --set pipeline.stages=2 --set pipeline.micro_batches=2 \
	--set train.batch_size=4 --set log.every=25 --set eval.every=100
step "3. evaluate" "$A" eval "$OUT"
step "4. sample" "$A" sample "$OUT" --prompt "The old boat" -n 60 --seed 7
printf '\nDone. The run is in %s (metrics.csv, checkpoints). Next: %s help train.\n' "$OUT" "$A"
