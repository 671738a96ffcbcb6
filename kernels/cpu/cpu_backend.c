/* cpu_backend.c - the CPU reference backend's table (filled in by the
 * kernels in this folder). */
#include "../backend.h"

const struct backend backend_cpu = {
	.name = "cpu",
};
