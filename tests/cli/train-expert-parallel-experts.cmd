$ASYNCPP train -q --set train.out_dir=r --set model.n_expert=6 --set pipeline.data_parallel=4 --set model.expert_parallel=4; s=$?; [ -e r ] || echo "nothing written"; exit $s
