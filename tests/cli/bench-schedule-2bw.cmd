$ASYNCPP bench schedule --kind 2bw --stages 2 --micro 2 --steps 4
