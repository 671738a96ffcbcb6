$ASYNCPP train -q --set model.n_expert=2 --set model.arch=gpt2 --set train.out_dir=run
