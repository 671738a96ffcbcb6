# shard_zstd.sh - standard zstd tools accept asyncpp shards; a damaged or
# cut shard is refused by them too, and by `asyncpp inspect`.
. "$ROOT/tests/lib.sh"
C=$ROOT/tests/fuzz/corpus/shard
if ! command -v zstd > /dev/null; then
	skip zstd_t "no zstd program"
	exit 0
fi
for f in tiny-u16.shard tiny-u32.shard empty.shard; do
	expect_exit 0 "zstd -t $f" -- zstd -q -t "$C/$f"
	expect_exit 0 "inspect $f" -- "$ASYNCPP" inspect "$C/$f"
done
# 16 u16 tokens in 2 chunks: zstd -d gives exactly the 32 token bytes
n=$(zstd -q -d -c "$C/tiny-u16.shard" | wc -c)
if [ "$n" -eq 32 ]; then pass "zstd -d gives the token bytes"; else
	fail "zstd -d gives the token bytes" "$n bytes, expected 32"; fi
expect_exit 1 "zstd -t refuses a cut shard" -- zstd -q -t "$C/bad-truncated.shard"
