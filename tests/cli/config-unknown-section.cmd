printf '[model]\nn_layer = 2\n[optimizer]\nlr = 1\n' > run.ini && $ASYNCPP train -c run.ini --print-config
