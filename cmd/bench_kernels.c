/* bench_kernels.c - placeholder until its issue lands. */
#include "bench.h"
#include "cmd.h"
int bench_kernels(int argc, char **argv) { (void)argc; (void)argv; return cmd_not_implemented("bench kernels"); }
