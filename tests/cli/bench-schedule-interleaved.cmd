$ASYNCPP bench schedule --kind interleaved --virtual 2 --stages 2 --micro 4
