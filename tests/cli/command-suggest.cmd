$ASYNCPP trian
