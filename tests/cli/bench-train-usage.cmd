$ASYNCPP bench train -h | head -n 1; $ASYNCPP bench train --sweep fast 2> err; rc=$?; head -n 1 err; exit $rc
