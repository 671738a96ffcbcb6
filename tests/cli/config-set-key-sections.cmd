$ASYNCPP train --set every=5 --set train.lr=1 --print-config; $ASYNCPP train --set train.every=5 --print-config
