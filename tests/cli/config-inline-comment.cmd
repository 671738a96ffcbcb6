printf '[model]\n  n_layer = 3   # three\n[data]\ntrain = a#b.zst ; c\n' > run.ini && $ASYNCPP train -c run.ini --print-config | grep -E '^(n_layer|train) ='
