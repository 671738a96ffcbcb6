$ASYNCPP tokenize frobnicate
