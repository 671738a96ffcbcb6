$ASYNCPP train --set optim.nme=muon --print-config
