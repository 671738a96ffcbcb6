$ASYNCPP sample --top-p 1.5 x.ckpt 2> err; rc=$?; head -n 1 err; exit $rc
