$ASYNCPP bench plan --model gpt2-124m --ep 2 2>&1 > /dev/null | head -n 1
