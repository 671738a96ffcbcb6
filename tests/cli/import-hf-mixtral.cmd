cp -r "$TESTDATA/hf/mixtral" m && $ASYNCPP import-hf -o mixtral.ckpt m && $ASYNCPP export --format hf --dtype bf16 -o out mixtral.ckpt && ls out && cat out/config.json
