cp "$ROOT/tests/fuzz/corpus/shard/tiny-llmc.bin" t.bin && $ASYNCPP inspect t.bin
