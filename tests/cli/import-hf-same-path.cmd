# the tokenizer cannot be written over the checkpoint it goes with
cp -r "$TESTDATA/hf/gpt2" m && $ASYNCPP import-hf -o g.ckpt --tokenizer-out g.ckpt m 2> err.txt; echo "exit $?"; head -n 1 err.txt; rm err.txt; ls m > /dev/null; echo "files: $(ls | grep -c -v "^m$\|^std")"
