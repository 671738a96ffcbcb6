// tokenizer_hf_ref.js - the reference tokenizer.json encoder (the npm package
// @huggingface/tokenizers: Hugging Face's tokenizers in JavaScript) for
// tests/scripts/tokenizer_hf_families.sh. Not a test itself (tests/run runs
// *.sh).
//
//   node tokenizer_hf_ref.js PKG ids TOKENIZER_JSON FILE   ids of FILE, space-separated
//   node tokenizer_hf_ref.js PKG added TOKENIZER_JSON FILE the same with the added tokens
//                                                          found in the text (Hugging Face's
//                                                          default; TOK_SPLIT_ADDED)
//   node tokenizer_hf_ref.js - ranks TOKENIZER_JSON        its vocabulary as a .tiktoken
//                                                          rank file (ids as ranks)
//
// PKG is the folder of the installed package. No special tokens are added
// (add_special_tokens false).
'use strict';
const fs = require('fs');
const path = require('path');
const [pkg, mode, json, file] = process.argv.slice(2);
const tj = JSON.parse(fs.readFileSync(json, 'utf8'));

if (mode === 'ranks') { // GPT-2's byte alphabet back to bytes
	const bs = [];
	for (let b = 0; b < 256; b++)
		if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)
			bs.push(b);
	const cps = bs.slice();
	for (let b = 0, k = 0; b < 256; b++)
		if (!bs.includes(b)) {
			bs.push(b);
			cps.push(256 + k++);
		}
	const byteOf = new Map();
	bs.forEach((b, i) => byteOf.set(String.fromCodePoint(cps[i]), b));
	const out = [];
	for (const [tok, id] of Object.entries(tj.model.vocab))
		out.push(Buffer.from([...tok].map((c) => byteOf.get(c))).toString('base64') + ' ' + id);
	process.stdout.write(out.join('\n') + '\n');
	process.exit(0);
}

const { Tokenizer } = require(path.join(pkg, 'dist', 'tokenizers.cjs'));
// asyncpp encodes a special token's text as text (as tiktoken's
// encode_ordinary, and Hugging Face's with split_special_tokens): the
// reference gets no added tokens to split out.
const t = new Tokenizer(mode === 'added' ? tj : Object.assign({}, tj, { added_tokens: [] }), {});
// Hugging Face's Digits splits at Rust's char::is_numeric (\p{N}: Nd, Nl,
// No; tokenizers/src/pre_tokenizers/digits.rs); this package's at JavaScript's
// \d (0-9 alone). Set the Rust one, so that the reference is the library that
// SmolLM's users run; tokenizer_hf_families.sh checks that it was set.
let patched = 0;
for (const p of (t.pre_tokenizer && t.pre_tokenizer.tokenizers) || [t.pre_tokenizer])
	if (p && p.pattern instanceof RegExp && /^\[\^\\d\]\+\|\\d\+?$/.test(p.pattern.source)) {
		p.pattern = new RegExp(p.pattern.source.replace(/\\d/g, '\\p{N}'), 'gu');
		patched++;
	}
if (tj.pre_tokenizer && JSON.stringify(tj.pre_tokenizer).includes('"Digits"') && !patched) {
	console.error('tokenizer_hf_ref.js: the Digits pre-tokenizer was not found to patch');
	process.exit(1);
}
const text = fs.readFileSync(file, 'utf8');
if (mode === 'ids' || mode === 'added')
	console.log(t.encode(text, { add_special_tokens: false }).ids.join(' '));
