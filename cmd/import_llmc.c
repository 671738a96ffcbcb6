/* import_llmc.c - placeholder until its issue lands. */
#include "cmd.h"
int cmd_import_llmc(int argc, char **argv) { (void)argc; (void)argv; return cmd_not_implemented("import-llmc"); }
