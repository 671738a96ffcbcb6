#!/usr/bin/env bash
# llmc_import.sh - an llm.c GPT-2 checkpoint imported with `asyncpp
# import-llmc` computes, through `asyncpp eval`, the loss an independent
# Python GPT-2 computes on the same tokens; `asyncpp export` writes the
# same weights as safetensors.
. "$ROOT/tests/lib.sh"
command -v python3 > /dev/null || { skip llmc_import "python3 not found"; exit 0; }
python3 "$ROOT/tests/scripts/gpt2_reference.py" ref.bin tokens.bin > ref.txt || { fail llmc_import "reference failed"; exit 0; }
want=$(sed -n 's/^loss: //p' ref.txt)
if "$ASYNCPP" import-llmc ref.bin -o ref.ckpt > out.txt 2> err.txt; then pass import_llmc; else fail import_llmc "$(cat err.txt)"; fi
if "$ASYNCPP" eval ref.ckpt --data tokens.bin --batches 1 --batch-size 2 > eval.txt 2> err.txt; then
	got=$(sed -n 's/^loss *//p' eval.txt)
	if awk -v a="$got" -v b="$want" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 1e-4) }'; then
		pass "llmc_loss_matches_reference ($got vs $want)"
	else
		fail llmc_loss_matches_reference "asyncpp $got, reference $want"
	fi
else
	fail llmc_loss_matches_reference "$(cat err.txt)"
fi
# export: every tensor of the safetensors file equals the llm.c file's
if "$ASYNCPP" export ref.ckpt -o ref.safetensors > /dev/null 2> err.txt &&
   python3 - ref.bin ref.safetensors > cmp.txt 2>&1 <<'PY'
import json, struct, sys
llmc = open(sys.argv[1], "rb").read()
h = struct.unpack("<256i", llmc[:1024])
maxT, V, L, NH, C, Vp = h[2], h[3], h[4], h[5], h[6], h[7]
f = list(struct.unpack("<%df" % ((len(llmc) - 1024) // 4), llmc[1024:]))
st = open(sys.argv[2], "rb").read()
n = struct.unpack("<Q", st[:8])[0]
hdr = json.loads(st[8:8 + n])
data = st[8 + n:]
def tensor(name):
    a, b = hdr[name]["data_offsets"]
    return list(struct.unpack("<%df" % ((b - a) // 4), data[a:b]))
sizes = [("wte", Vp * C), ("wpe", maxT * C), ("ln1w", L * C), ("ln1b", L * C),
         ("qkvw", L * 3 * C * C), ("qkvb", L * 3 * C), ("attprojw", L * C * C),
         ("attprojb", L * C), ("ln2w", L * C), ("ln2b", L * C), ("fcw", L * 4 * C * C),
         ("fcb", L * 4 * C), ("fcprojw", L * C * 4 * C), ("fcprojb", L * C), ("lnfw", C), ("lnfb", C)]
off, bad = 0, 0
for name, size in sizes:
    chunk = f[off:off + size]
    off += size
    if name in ("wte", "wpe", "lnfw", "lnfb"):
        got = tensor(name)
        want = chunk[:len(got)]
        bad += got != want
    else:
        per = size // L
        for l in range(L):
            bad += tensor("h.%d.%s" % (l, name)) != chunk[l * per:(l + 1) * per]
print("mismatches", bad)
sys.exit(1 if bad else 0)
PY
then pass export_safetensors_equals_llmc_weights; else fail export_safetensors_equals_llmc_weights "$(cat err.txt cmp.txt | head -c 300)"; fi
