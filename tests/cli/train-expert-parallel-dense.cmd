$ASYNCPP train -q --set train.out_dir=r --set model.expert_parallel=2; s=$?; [ -e r ] || echo "nothing written"; exit $s
