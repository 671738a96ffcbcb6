$ASYNCPP bench plan --model gpt2-124m --vocab 0 --latency 0 --nvlink 1e12 --ib 1e12 --hbm 1e12 --stages 4,12,16 --dp 1,16
