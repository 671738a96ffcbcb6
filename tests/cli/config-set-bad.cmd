$ASYNCPP train --set train.steps=10 --set optim.lr=fast --print-config
