cp "$ROOT/tests/fuzz/corpus/shard/bad-version.shard" v.shard && $ASYNCPP inspect v.shard
