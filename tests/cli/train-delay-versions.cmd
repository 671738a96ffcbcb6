$ASYNCPP train -q --set train.delay=64 --set optim.correction=predict --set model.n_layer=1 --set model.d_model=32 --set train.steps=1 --set train.out_dir=o
