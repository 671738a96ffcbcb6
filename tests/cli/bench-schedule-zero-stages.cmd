$ASYNCPP bench schedule --kind 1f1b --stages 0 --micro 8 2> err; rc=$?; head -n 1 err; exit $rc
