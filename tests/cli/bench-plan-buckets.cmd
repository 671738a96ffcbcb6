# the replicas' sum in buckets during the last backward against one sum after it
$ASYNCPP bench plan --model gpt2-1.5b --stages 1,4,16 --dp 1,64 --bucket-mb 25 | tail -n 7
$ASYNCPP bench plan --model gpt2-1.5b --stages 1,4,16 --dp 1,64 --bucket-mb 0 | tail -n 7
