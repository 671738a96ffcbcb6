$ASYNCPP tokenize encod 2> err; rc=$?; head -n 1 err; exit $rc
