$ASYNCPP bench schedule --kind zb --stages 4 --micro 8 --steps 2 2> err; rc=$?; head -n 1 err; exit $rc
