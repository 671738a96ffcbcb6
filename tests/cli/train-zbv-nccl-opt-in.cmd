ASYNCPP_NCCL_ZBV=1 $ASYNCPP train -q --set train.out_dir=r --set train.schedule=zb-v --set pipeline.stages=2 --set pipeline.micro_batches=4 --set pipeline.transport=nccl --set train.device=cuda
