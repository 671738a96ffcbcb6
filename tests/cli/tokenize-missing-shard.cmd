$ASYNCPP tokenize train -q --vocab 300 -o t.tok $TESTDATA/corpus/sea.txt && $ASYNCPP tokenize decode -t t.tok missing.shard
