$ASYNCPP bench schedule --kind zb-v --stages 4 --micro 7 2> err; rc=$?; head -n 1 err; exit $rc
