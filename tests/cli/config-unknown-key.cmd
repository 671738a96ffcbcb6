printf '[optim]\nlr = 1e-3\n\n\n\n\n\n\n\n\n\nlr_max = 1\n' > run.ini && $ASYNCPP train -c run.ini --print-config
