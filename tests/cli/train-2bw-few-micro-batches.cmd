$ASYNCPP train --set train.schedule=2bw --set pipeline.stages=4 --set pipeline.micro_batches=2 --set model.n_layer=4 --set model.d_model=32 --set train.steps=1 --set train.out_dir=o -q
