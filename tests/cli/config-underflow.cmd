$ASYNCPP train --set optim.lr=1e-400 --print-config 2> err; rc=$?; cat err; exit $rc
