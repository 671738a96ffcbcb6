$ASYNCPP plot
