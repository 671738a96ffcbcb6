cp "$ROOT/tests/fuzz/corpus/shard/tiny-u16.shard" t.shard && printf '\x24' | dd of=t.shard bs=1 seek=85 conv=notrunc 2>/dev/null && $ASYNCPP inspect t.shard > /dev/null
