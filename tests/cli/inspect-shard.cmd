cp "$ROOT/tests/fuzz/corpus/shard/tiny-u16.shard" t.shard && $ASYNCPP inspect t.shard
