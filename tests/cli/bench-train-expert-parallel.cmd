$ASYNCPP bench train --set model.n_expert=4 --set pipeline.data_parallel=2 --set pipeline.micro_batches=2 --set model.expert_parallel=2
