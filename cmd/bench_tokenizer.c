/* bench_tokenizer.c - placeholder until its issue lands. */
#include "bench.h"
#include "cmd.h"
int bench_tokenizer(int argc, char **argv) { (void)argc; (void)argv; return cmd_not_implemented("bench tokenizer"); }
