$ASYNCPP tokenize
