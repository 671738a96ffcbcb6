printf '[optim]\n# the peak\n\n\n\nname = adamw\nlr = fast\n' > run.ini && $ASYNCPP train -c run.ini --print-config
