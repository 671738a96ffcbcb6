$ASYNCPP bench train --set train.schedule=zb-v --set pipeline.stages=2 --set pipeline.micro_batches=4 --set model.n_layer=4 --set model.d_model=32 --steps 1 --warmup 0
