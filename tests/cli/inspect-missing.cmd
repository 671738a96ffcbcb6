$ASYNCPP inspect missing.shard
