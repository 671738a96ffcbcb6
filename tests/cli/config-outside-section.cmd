printf 'steps = 3\n[train]\n' > run.ini && $ASYNCPP train -c run.ini --print-config
