printf '[train]\nschedule = zb\n' > run.ini && $ASYNCPP train -c run.ini --print-config
