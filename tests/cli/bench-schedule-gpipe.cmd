$ASYNCPP bench schedule --kind gpipe --stages 2 --micro 2
