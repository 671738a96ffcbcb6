$ASYNCPP inspect -h
