$ASYNCPP tokenize train -q --vocab 300 -o t.tok $TESTDATA/corpus/*.txt && printf "The cat sat on the mat. It's 12:30\n\n" | $ASYNCPP tokenize encode -t t.tok --ids -
