// tokenizer_spm_ref.js - the reference for tests/scripts/tokenizer_spm_families.sh:
// Hugging Face's tokenizers in JavaScript (the npm package
// @huggingface/tokenizers) on a SentencePiece-style tokenizer.json. Not a
// test itself (tests/run runs *.sh).
//
//   node tokenizer_spm_ref.js PKG ids TOKENIZER_JSON FILE     ids of FILE, space-separated
//   node tokenizer_spm_ref.js PKG decode TOKENIZER_JSON FILE  FILE encoded, then decoded
//
// PKG is the folder of the installed package. No special tokens are added
// (add_special_tokens false), and a special token's text is text, as
// asyncpp encodes it (the reference gets no added tokens to split out).
'use strict';
const fs = require('fs');
const path = require('path');
const [pkg, mode, json, file] = process.argv.slice(2);
const tj = JSON.parse(fs.readFileSync(json, 'utf8'));
const { Tokenizer } = require(path.join(pkg, 'dist', 'tokenizers.cjs'));
const t = new Tokenizer(Object.assign({}, tj, { added_tokens: [] }), {});
const text = fs.readFileSync(file, 'utf8');
const ids = t.encode(text, { add_special_tokens: false }).ids;
if (mode === 'ids')
	console.log(ids.join(' '));
else if (mode === 'decode')
	process.stdout.write(t.decode(ids, { skip_special_tokens: true, clean_up_tokenization_spaces: false }));
