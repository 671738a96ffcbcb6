cp -r "$TESTDATA/hf/gpt2" m && touch g.tok && $ASYNCPP import-hf -o g.ckpt m
