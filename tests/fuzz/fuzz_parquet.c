/* fuzz_parquet.c - the Parquet reader (io/text/parquet.h): open a column
 * and read every value, by the name "text" and by "id" (a non-string
 * column), with snappy, gzip and zstd pages. Must never crash, hang or
 * read out of bounds, whatever the bytes. */
#include <stddef.h>
#include <stdint.h>

#include "../../io/text/parquet.h"
#include "../../io/util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const columns[] = {"text", "id"};
	set_error_quiet(1);
	for (size_t c = 0; c < ARRAY_SIZE(columns); c++) {
		struct parquet *p;
		if (parquet_open_mem(&p, data, size, "fuzz.parquet", columns[c]))
			continue;
		const uint8_t *s;
		size_t n, total = 0;
		int r;
		while ((r = parquet_next(p, &s, &n)) > 0) {
			for (size_t i = 0; i < n; i++) /* every byte given is readable */
				total += s[i];
		}
		(void)total;
		parquet_close(p);
	}
	return 0;
}
