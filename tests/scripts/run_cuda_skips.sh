#!/usr/bin/env bash
# run_cuda_skips.sh - tests/run folds the CUDA tests' skips (no GPU here)
# into one line per reason, shows every other skip, and still counts each
# one in its closing "N passed, N failed, N skipped". It runs tests/run on
# a build folder of fake test programs (their names hold "zzfake", the
# pattern that selects them alone).
. "$ROOT/tests/lib.sh"
mkdir -p fake/tests/unit
# fake NAME LINES: a test program printing LINES
fake() {
	printf '#!/bin/sh\nprintf "%s"\n' "$2" > "fake/tests/unit/$1"
	chmod +x "fake/tests/unit/$1"
}
NODRV='no CUDA driver found'
fake test_cuda_zzfake_ops "SKIP cuda_a: $NODRV\nSKIP cuda_b: $NODRV\nPASS cuda_c_on_cpu\n"
fake test_cuda_zzfake_nccl "SKIP cuda_d: NCCL (libnccl.so.2) not found\nSKIP cuda_e: $NODRV\n"
fake test_zzfake_other 'SKIP f: no zstd program\nPASS g\n'
# (a path from the root: tests/run takes either)
BUILD=$(realpath --relative-to="$ROOT" fake) bash "$ROOT/tests/run" zzfake > out.txt 2>&1
rc=$?
if [ "$rc" -eq 0 ] && [ "$(tail -n 1 out.txt)" = "2 passed, 0 failed, 5 skipped" ]; then
	pass cuda_skips_counted
else
	fail cuda_skips_counted "exit $rc: $(tail -n 3 out.txt | tr '\n' '|')"
fi
if grep -qx 'SKIP 3 CUDA tests: no CUDA driver found' out.txt &&
   grep -qx 'SKIP 1 CUDA test: NCCL (libnccl.so.2) not found' out.txt &&
   [ "$(grep -c 'SKIP' out.txt)" -eq 3 ] &&
   grep -qx '  test_zzfake_other: SKIP f: no zstd program' out.txt; then
	pass cuda_skips_folded
else
	fail cuda_skips_folded "$(grep SKIP out.txt | tr '\n' '|')"
fi
