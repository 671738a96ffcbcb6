$ASYNCPP train -q --set train.out_dir=r --set train.schedule=1f1b --set pipeline.stages=2 --set pipeline.micro_batches=2 --set train.delay=1; s=$?; [ -e r ] || echo "nothing written"; exit $s
