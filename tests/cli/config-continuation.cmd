printf '[optim]\nlr = 0.01\n    0.5\n' > run.ini && $ASYNCPP train -c run.ini --print-config
