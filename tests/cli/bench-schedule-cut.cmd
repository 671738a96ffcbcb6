$ASYNCPP bench schedule --kind 1f1b --stages 4 --micro 8 --no-timeline --set model.arch=gpt2 --set model.n_layer=12 --set model.d_model=768 --set model.n_head=12 --set model.seq_len=1024
