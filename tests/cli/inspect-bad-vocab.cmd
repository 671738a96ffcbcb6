cp "$ROOT/tests/fuzz/corpus/shard/bad-vocab.shard" v.shard && $ASYNCPP inspect v.shard > /dev/null
