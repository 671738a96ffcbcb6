$ASYNCPP bench schedule --kind zb-h1 --virtual 2 --stages 2 --micro 2 2> err; rc=$?; head -n 1 err; exit $rc
