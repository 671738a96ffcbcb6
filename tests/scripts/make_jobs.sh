#!/usr/bin/env bash
# make_jobs.sh - make runs one job per core by default, but a -j1 holds for
# the sub-makes too (make test, demo, asan and fuzz call $(MAKE)), and a
# make that cleans runs its goals one at a time (make clean all must not
# build while it removes). Dry runs (-n) into a scratch BUILD: nothing is
# built; a flags-shown goal prints each make's MAKEFLAGS and MAKELEVEL.
set -u
. "$ROOT/tests/lib.sh"
SHOW=(--eval 'flags-shown: ; @echo "FLAGS[$(MAKELEVEL)]=$(MAKEFLAGS)"')
# dry MAKEARGS...: the FLAGS lines of a dry run, by a top make (not one
# under make test's: its MAKEFLAGS and MAKELEVEL are left out)
dry() { env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -n -C "$ROOT" --no-print-directory BUILD="$PWD/b" CUDA=0 "${SHOW[@]}" "$@" 2>&1 |
	sed -n 's/^echo "\(FLAGS\[.*\)"$/\1/p'; }

# 1. make -j1 demo: the sub-make that builds is one job too
flags=$(dry -j1 --eval 'all: flags-shown' demo)
if grep -q '^FLAGS\[1\]=' <<< "$flags" && ! grep -q -- '-j[02-9]\|-j1[0-9]\|jobserver' <<< "$flags"
then pass make_j1_holds_in_sub_makes; else
	fail make_j1_holds_in_sub_makes "$(tr '\n' '|' <<< "$flags")"; fi

# 2. make clean all: no parallel jobs
flags=$(dry clean flags-shown)
if [ -n "$flags" ] && ! grep -q -- '-j\|jobserver' <<< "$flags"; then pass make_clean_is_serial
else fail make_clean_is_serial "$flags"; fi

# 3. a plain make: one job per core (where there are several)
flags=$(dry flags-shown)
if [ "$(nproc)" -lt 2 ]; then skip make_parallel_by_default "one core"
elif grep -q -- "-j$(nproc)" <<< "$flags"; then pass make_parallel_by_default
else fail make_parallel_by_default "$flags"; fi
