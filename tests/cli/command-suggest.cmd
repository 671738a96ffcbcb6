mkdir -p bin && ln -sf "$ASYNCPP" bin/asyncpp && cd bin && ./asyncpp trian
