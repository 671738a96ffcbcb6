# a failed import --force replaces neither file: the tokenizer waits for the checkpoint
cp -r "$TESTDATA/hf/gpt2" m && printf old > g.tok && $ASYNCPP import-hf -o nodir/g.ckpt --tokenizer-out g.tok --force m > /dev/null 2> err.txt; echo "exit $?"; cat g.tok; echo; grep -c "nodir" err.txt; rm err.txt; ls *.tok; echo "checkpoints: $(ls | grep -c ckpt)"
