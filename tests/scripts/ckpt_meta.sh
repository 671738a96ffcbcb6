#!/usr/bin/env bash
# ckpt_meta.sh - a checkpoint's metadata, index shapes and model config are
# checked on read (issue 32): each case edits one field of a real
# checkpoint (tests/scripts/ckpt_edit.py rewrites the chunk and its
# checksums, so only the field is wrong) and the command must refuse it
# with exit 1 and a message naming the file, the field and what it may be.
. "$ROOT/tests/lib.sh"
A=$ASYNCPP
EDIT="python3 $ROOT/tests/scripts/ckpt_edit.py"
command -v zstd > /dev/null || { skip ckpt_meta "no zstd command"; exit 0; }
TINY=(--set model.n_layer=1 --set model.d_model=32 --set model.n_head=2 --set model.seq_len=32
      --set train.batch_size=4 --set eval.every=0 --set train.threads=1)
$A train -q "${TINY[@]}" --set train.steps=2 --set train.out_dir=run 2> err.txt ||
	{ fail ckpt_meta_setup "$(cat err.txt)"; exit 0; }
CK=run/ckpt-00000002.ckpt
EVAL=(eval --batches 1)

# refuse NAME PART OLD NEW WANT [COMMAND...]: CK with OLD replaced by NEW in
# its PART (config, meta or index) is refused by COMMAND (default eval)
# with exit 1 and WANT in the message, which names the file
refuse() {
	local name=$1 part=$2 old=$3 new=$4 want=$5; shift 5
	[ $# -gt 0 ] || set -- "${EVAL[@]}"
	if ! $EDIT $CK "$name.ckpt" "$part" "$old" "$new" 2> edit.err; then
		fail "$name" "edit: $(head -c 300 edit.err)"; return
	fi
	"$A" "$@" "$name.ckpt" > out.txt 2> err.txt
	local rc=$?
	if [ $rc -ne 1 ]; then fail "$name" "exit $rc, expected 1: $(head -c 300 err.txt)"
	elif ! grep -qF "'$name.ckpt'" err.txt || ! grep -qF -- "$want" err.txt; then
		fail "$name" "message lacks the file or '$want': $(head -c 300 err.txt)"
	else pass "$name"; fi
}

# the checkpoint as written, and with a key from a newer writer, is taken
expect_exit 0 ckpt_meta_valid -- "$A" "${EVAL[@]}" $CK
$EDIT $CK extra.ckpt meta "versions = 1\n" "versions = 1\nnewer_key = any text here\n"
expect_exit 0 ckpt_meta_unknown_key_accepted -- "$A" "${EVAL[@]}" extra.ckpt

refuse versions_0 meta "versions = 1" "versions = 0" "versions = 0 is out of range (1 to 65)"
refuse versions_66 meta "versions = 1" "versions = 66" "versions = 66 is out of range (1 to 65)"
refuse versions_66_export meta "versions = 1" "versions = 66" \
	"versions = 66 is out of range (1 to 65)" export -o out.bin
refuse versions_66_sample meta "versions = 1" "versions = 66" \
	"versions = 66 is out of range (1 to 65)" sample -n 4
refuse step_negative meta "step = 2" "step = -1" "step = -1 is out of range (0 to 1099511627776)"
refuse step_negative_resume meta "step = 2" "step = -1" \
	"step = -1 is out of range (0 to 1099511627776)" train -q "${TINY[@]}" \
	--set train.steps=4 --set train.out_dir=resumed --resume
refuse step_not_a_number meta "step = 2" "step = 2x" "step = 2x is not a decimal number"
refuse step_plus meta "step = 2" "step = +2" "step = +2 is not a decimal number"
refuse step_missing meta "step = 2\n" "" "metadata has no 'step'"
refuse versions_missing meta "versions = 1\n" "" "metadata has no 'versions'"
refuse step_twice meta "versions = 1\n" "versions = 1\nstep = 2\n" "line 3 gives 'step' again"
refuse meta_not_key_value meta "stages = 1" "stages=1" "metadata line 4 is not 'KEY = VALUE'"
rid=$("$A" inspect -v $CK | grep '^run_id = ') # the last line, the run's own
refuse meta_unterminated meta "$rid\n" "$rid" "does not end in a newline"
refuse run_id_0 meta "$rid" "run_id = 0x0" "run_id = 0x0 is out of range"
refuse seed_negative meta "seed = 1337" "seed = -5" "seed = -5 is out of range"
refuse stages_0 meta "stages = 1" "stages = 0" "stages = 0 is out of range (1 to 4096)"
refuse micro_batches_0 meta "micro_batches = 1" "micro_batches = 0" \
	"micro_batches = 0 is out of range (1 to 1048576)"
refuse data_position_behind meta "data_position = 2" "data_position = 1" \
	"data_position = 1 is below step = 2"
refuse rng_state_other_step meta "step = 2" "step = 3" \
	"rng_state = 9376492189181083021 is not the one seed = 1337 and step = 3 give"
refuse rng_state_overflow meta "rng_state = 9376492189181083021" \
	"rng_state = 18446744073709551616" "rng_state = 18446744073709551616 is not a decimal number"
refuse tokenizer_hash_bad meta "tokenizer_hash = 0x" "tokenizer_hash = 0y" \
	"is not a decimal or 0x hex number"
refuse versions_without_weights meta "versions = 1" "versions = 2" \
	"weights.v1 holds 0 tensors, weights.v0 8"
refuse weights_beyond_versions index "weights.v0/h.0.ln2w" "weights.v1/h.0.ln2w" \
	"tensor 'weights.v1/h.0.ln2w' is beyond the metadata's versions = 1"
refuse weights_bad_version index "weights.v0/h.0.ln2w" "weights.v01/h.0.ln2w" \
	"tensor 'weights.v01/h.0.ln2w' names no weight version"
refuse index_transposed index "weights.v0/h.0.qkvw 3072 96 32" "weights.v0/h.0.qkvw 3072 32 96" \
	"tensor 'weights.v0/h.0.qkvw' is 32x96 in the index; the model of its configuration has it 96x32"
refuse index_transposed_state index "adam_m/h.0.fcw 8192 256 32" "adam_m/h.0.fcw 8192 32 256" \
	"tensor 'adam_m/h.0.fcw' is 32x256 in the index" train -q "${TINY[@]}" \
	--set train.steps=4 --set train.out_dir=resumed2 --resume
# a 2-layer checkpoint whose config says 1 layer: h.1's tensors are no
# part of that model (they were ignored)
$A train -q "${TINY[@]}" --set model.n_layer=2 --set train.steps=1 --set train.out_dir=two \
	2> err.txt || fail ckpt_meta_setup_two "$(cat err.txt)"
CK=two/ckpt-00000001.ckpt refuse foreign_tensor config "n_layer = 2" "n_layer = 1" \
	"tensor 'weights.v0/h.1.ln1w' is no parameter of the model its configuration describes"
# issue 32: a bad model config inside a checkpoint names the checkpoint
refuse model_config_bad config "n_head = 2" "n_head = 3" "d_model 32 is not a multiple of n_head 3"
refuse model_config_bad_resume config "n_head = 2" "n_head = 3" \
	"d_model 32 is not a multiple of n_head 3" train -q --set train.out_dir=resumed3 --resume

# what the imports write opens again, whatever the path they name in
# imported_from: a folder name holding a newline (the line was cut in two),
# an llm.c file under a long path (the line was cut short, without '\n')
opens_again() { # NAME CKPT WANT: inspect opens CKPT and shows WANT
	if $A inspect "$2" > out.txt 2> err.txt && grep -qF -- "$3" out.txt; then
		pass "$1"
	else
		fail "$1" "$(head -c 300 err.txt)"
	fi
}
cp -r "$TESTDATA/hf/gpt2" "new
line"
if $A import-hf -o nl.ckpt "new
line" > out.txt 2> err.txt; then
	opens_again import_hf_odd_folder_name_opens nl.ckpt "imported_from = new?line"
else
	fail import_hf_odd_folder_name_opens "import: $(head -c 300 err.txt)"
fi
long=$(printf 'd%.0s' $(seq 1 120))/$(printf 'e%.0s' $(seq 1 120))
mkdir -p "$long"
if ! python3 "$ROOT/tests/scripts/gpt2_reference.py" "$long/ref.bin" tokens.bin > /dev/null; then
	fail import_llmc_long_path_opens "the reference llm.c checkpoint could not be made"
elif $A import-llmc "$long/ref.bin" -o long.ckpt > out.txt 2> err.txt; then
	opens_again import_llmc_long_path_opens long.ckpt "imported_from = $long/ref.bin"
else
	fail import_llmc_long_path_opens "import: $(head -c 300 err.txt)"
fi
