$ASYNCPP bench schedule --stages 4 --micro 8 2> err; rc=$?; head -n 1 err; exit $rc
