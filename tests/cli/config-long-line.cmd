{ printf '[data]\n'; printf 'train = %0250d\n' 0; } > run.ini && $ASYNCPP train -c run.ini --print-config
