# a small mixture of experts on S stages x EP x DP (EP = 2 leaves out DP = 1)
$ASYNCPP bench plan --layers 4 --d-model 256 --vocab 1000 --seq 128 --experts 4 --top-k 2 --d-expert 512 --shared-expert --tflops 100 --stages 1,2,8 --dp 1,2,4 --ep 1,2
