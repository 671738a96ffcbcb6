#!/usr/bin/env bash
# nonfinite_doors.sh - no command lets NaN or infinite weights through
# (issue 32 item 6): import-hf and import-llmc refuse a model holding one
# and write nothing; export, sample and eval (and train --resume, through
# the same ckpt_load_weights) refuse a checkpoint holding one. Each names
# the tensor. The checkpoint
# testdata/nonfinite/nan-weight.ckpt is testdata/hf/gpt2 with
# h.0.attn.c_attn.weight[5] set to NaN, as an older import-hf wrote it.
. "$ROOT/tests/lib.sh"
A=$ASYNCPP
NAN_CKPT=$TESTDATA/nonfinite/nan-weight.ckpt

# testdata/hf/gpt2 with one F32 value of h.0.attn.c_attn.weight set to NaN
if ! command -v python3 > /dev/null; then
	skip import_hf_refuses_nan "python3 not found"
else
	cp -r "$TESTDATA/hf/gpt2" hfnan
	python3 - hfnan/model.safetensors <<'PY'
import json, struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
t = json.loads(b[8:8 + n])["h.0.attn.c_attn.weight"]
assert t["dtype"] == "F32"
off = 8 + n + t["data_offsets"][0] + 4 * 5
b[off:off + 4] = struct.pack("<f", float("nan"))
open(p, "wb").write(b)
PY
	"$A" import-hf -o imported.ckpt hfnan > out.txt 2> err.txt
	rc=$?
	if [ $rc -eq 1 ] && grep -q "tensor 'h.0.attn.c_attn.weight' holds nan at index 5" err.txt &&
	   [ ! -e imported.ckpt ] && [ ! -e imported.tok ]; then
		pass import_hf_refuses_nan
	else
		fail import_hf_refuses_nan "exit $rc, files: $(ls imported.* 2> /dev/null): $(cat err.txt)"
	fi
fi

# every reader of a checkpoint's weights refuses the NaN one, naming it
said="weights.v0/h.0.qkvw\[80\] is nan"
refuses() { # NAME CMD...
	local name=$1; shift
	"$@" > out.txt 2> err.txt
	local rc=$?
	if [ $rc -eq 1 ] && grep -q "$said" err.txt; then
		pass "$name"
	else
		fail "$name" "exit $rc: $(head -c 300 err.txt)"
	fi
}
refuses export_refuses_nan "$A" export -o exported.safetensors "$NAN_CKPT"
[ -e exported.safetensors ] && fail export_writes_nothing "exported.safetensors was written"
refuses export_hf_refuses_nan "$A" export --format hf --no-tokenizer -o exported-hf "$NAN_CKPT"
[ -e exported-hf ] && fail export_hf_writes_nothing "exported-hf was made"
refuses sample_refuses_nan "$A" sample -n 4 "$NAN_CKPT"
refuses eval_refuses_nan "$A" eval "$NAN_CKPT"
# inspect still reads it and says what is wrong (exit 1)
"$A" inspect "$NAN_CKPT" > out.txt 2> err.txt
rc=$?
if [ $rc -eq 1 ] && grep -q "h.0.qkvw .* 1 NON-FINITE" out.txt; then
	pass inspect_names_nan
else
	fail inspect_names_nan "exit $rc: $(head -c 300 err.txt)"
fi

# import-llmc: the reference llm.c checkpoint with its first weight set to NaN
if ! command -v python3 > /dev/null; then
	skip import_llmc_refuses_nan "python3 not found"
elif python3 "$ROOT/tests/scripts/gpt2_reference.py" ref.bin tokens.bin > /dev/null &&
     python3 -c 'import struct, sys
b = bytearray(open("ref.bin", "rb").read()); b[1024:1028] = struct.pack("<f", float("nan"))
open("ref.bin", "wb").write(b)'; then
	"$A" import-llmc ref.bin -o llmc.ckpt > out.txt 2> err.txt
	rc=$?
	if [ $rc -eq 1 ] && grep -q "'ref.bin': tensor '.*' holds nan at index 0" err.txt &&
	   [ ! -e llmc.ckpt ]; then
		pass import_llmc_refuses_nan
	else
		fail import_llmc_refuses_nan "exit $rc: $(head -c 300 err.txt)"
	fi
else
	fail import_llmc_refuses_nan "the reference checkpoint could not be made"
fi
