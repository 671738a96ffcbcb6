$ASYNCPP bench schedule --kind zb-h1 --stages 4 --micro 8
