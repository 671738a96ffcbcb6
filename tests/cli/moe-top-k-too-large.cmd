$ASYNCPP train -q --set model.n_expert=4 --set model.top_k=5 --set train.out_dir=run
