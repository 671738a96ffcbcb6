$ASYNCPP plot --y perplexity m.csv
