mkdir r && printf 'step,loss,val_loss\n1,2.5,\n' > r/metrics.csv && $ASYNCPP plot --y val_loss r/metrics.csv
