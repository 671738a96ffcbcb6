cp -r "$TESTDATA/hf/llama" m && $ASYNCPP import-hf -o llama.ckpt m && $ASYNCPP export --format hf --dtype bf16 -o out llama.ckpt && ls out
