$ASYNCPP bench schedule --kind 1f1b --stages 4 --micro 8 --fwd 2 --set model.n_layer=8 2> err; rc=$?; head -n 1 err; exit $rc
