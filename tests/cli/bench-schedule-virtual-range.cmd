$ASYNCPP bench schedule --kind interleaved --virtual 0 --stages 2 --micro 2 2> err; rc=$?; head -n 1 err; exit $rc
