$ASYNCPP import-hf
