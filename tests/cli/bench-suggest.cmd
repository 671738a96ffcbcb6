$ASYNCPP bench trian 2> err; rc=$?; head -n 1 err; exit $rc
