$ASYNCPP inspect --diff only-one.ckpt
