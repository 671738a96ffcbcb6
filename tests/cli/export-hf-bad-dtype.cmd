cp -r "$TESTDATA/hf/gpt2" m && $ASYNCPP import-hf -o g.ckpt m > /dev/null && $ASYNCPP export --format hf --dtype f8 -o out g.ckpt
