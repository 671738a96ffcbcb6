$ASYNCPP eval --batches -1 x.ckpt 2> err; rc=$?; head -n 1 err; exit $rc
