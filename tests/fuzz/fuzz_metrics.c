/* fuzz_metrics.c - fuzz entry point for the metrics reader plot uses (CSV
 * and JSON lines): any bytes are read or refused, never a crash, and every
 * row read has a step. */
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "../../io/report/metrics.h"
#include "../../io/util.h"
#include "fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char path[512];
	if (fuzz_file(data, size, "fuzz_metrics", path))
		return 0;
	set_error_quiet(1);
	struct metrics_series s = {0};
	if (!metrics_read(path, &s)) {
		if (s.n < 0 || (s.n > 0 && !s.rows))
			abort();
		metrics_series_free(&s);
	}
	metrics_is_metrics_file(path);
	unlink(path);
	return 0;
}
