cp -r "$TESTDATA/hf/gpt2" m && sed -i "s/\"gpt2\"/\"gpt_neox\"/" m/config.json && $ASYNCPP import-hf m
