$ASYNCPP bench schedule --kind 2bw --stages 4 --micro 3 2> err; rc=$?; head -n 1 err; exit $rc
