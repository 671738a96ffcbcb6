/* train.c - placeholder until its issue lands. */
#include "cmd.h"
int cmd_train(int argc, char **argv) { (void)argc; (void)argv; return cmd_not_implemented("train"); }
