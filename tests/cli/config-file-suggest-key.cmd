printf "[optim]\nnme = muon\n" > run.ini && $ASYNCPP train -c run.ini --print-config
