#!/usr/bin/env bash
# layering.sh - the source folders include downward only (HACKING.md,
# "Layout and layering"): cmd -> io, model, sched, optim -> kernels -> io.
# Every #include "..." of a folder's .c, .h and .cu files is resolved to
# the folder it names, and a folder may reach only those below it:
#   io       io
#   kernels  kernels, io
#   model    model, kernels, io   (model/formats too)
#   optim    optim, model, kernels, io
#   sched    sched, model, optim, kernels, io
#   cmd      everything
# The FAIL line names the includes that reach up, with file and line.
. "$ROOT/tests/lib.sh"
command -v python3 > /dev/null || { skip layering "no python3"; exit 0; }

python3 - "$ROOT" <<'PY' > layering.out
import os, re, sys
root = sys.argv[1]
allowed = {
    "io": {"io"},
    "kernels": {"kernels", "io"},
    "model": {"model", "kernels", "io"},
    "optim": {"optim", "model", "kernels", "io"},
    "sched": {"sched", "model", "optim", "kernels", "io"},
}
inc = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
bad = 0
for top, ok in allowed.items():
    for d, _, files in os.walk(os.path.join(root, top)):
        for f in sorted(files):
            if not f.endswith((".c", ".h", ".cu")):
                continue
            path = os.path.join(d, f)
            for n, line in enumerate(open(path, errors="replace"), 1):
                m = inc.match(line)
                if not m:
                    continue
                target = os.path.normpath(os.path.join(d, m.group(1)))
                rel = os.path.relpath(target, root)
                first = rel.split(os.sep)[0]
                if first not in allowed and first != "cmd":
                    continue  # a header beside the tree (generated, system-like)
                if first not in ok:
                    print("%s:%d includes %s (%s may not reach %s)"
                          % (os.path.relpath(path, root), n, m.group(1), top, first))
                    bad += 1
print("bad", bad)
PY
if grep -q '^bad 0$' layering.out; then
	pass layering
else
	fail layering "$(grep -v '^bad' layering.out | head -5 | tr '\n' ';')"
fi
