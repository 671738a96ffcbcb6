// tokenizer_hf_ref.js - the reference tokenizer.json encoder (the npm package
// @huggingface/tokenizers: Hugging Face's tokenizers in JavaScript) for
// tests/scripts/tokenizer_hf_families.sh. Not a test itself (tests/run runs
// *.sh).
//
//   node tokenizer_hf_ref.js PKG ids TOKENIZER_JSON FILE   ids of FILE, space-separated
//
// PKG is the folder of the installed package. No special tokens are added
// (add_special_tokens false); the file holds no special token's text.
'use strict';
const fs = require('fs');
const path = require('path');
const [pkg, mode, json, file] = process.argv.slice(2);
const { Tokenizer } = require(path.join(pkg, 'dist', 'tokenizers.cjs'));
const t = new Tokenizer(JSON.parse(fs.readFileSync(json, 'utf8')), {});
const text = fs.readFileSync(file, 'utf8');
if (mode === 'ids')
	console.log(t.encode(text, { add_special_tokens: false }).ids.join(' '));
