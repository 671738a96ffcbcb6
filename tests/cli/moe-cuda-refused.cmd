$ASYNCPP train -q --set model.n_expert=4 --set train.device=cuda --set train.out_dir=run
