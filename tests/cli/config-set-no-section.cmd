$ASYNCPP train --set steps=10 --print-config
