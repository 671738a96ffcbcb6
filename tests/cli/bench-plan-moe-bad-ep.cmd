$ASYNCPP bench plan --model moe-10b --ep 3 2>&1 > /dev/null | head -n 1
