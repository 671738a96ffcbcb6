$ASYNCPP bench schedule --kind interleaved --virtual 2 --stages 4 --micro 6 2> err; rc=$?; head -n 1 err; exit $rc
