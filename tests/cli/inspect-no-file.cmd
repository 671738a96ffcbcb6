$ASYNCPP inspect
