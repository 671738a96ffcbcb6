// tokenizer_spm_ref.js - the references for tests/scripts/tokenizer_spm_families.sh:
// Hugging Face's tokenizers on a SentencePiece-style tokenizer.json, either
// the JavaScript port (the npm package @huggingface/tokenizers) or the Rust
// library itself (the npm package tokenizers: its Node binding, a native
// module). Not a test itself (tests/run runs *.sh).
//
//   node tokenizer_spm_ref.js PKG ids TOKENIZER_JSON FILE...  ids of each FILE, space-separated,
//                                                             a line each
//   node tokenizer_spm_ref.js PKG decode TOKENIZER_JSON FILE  FILE encoded, then decoded
//   node tokenizer_spm_ref.js PKG ids_special TOKENIZER_JSON FILE...  as ids, with
//                                                             add_special_tokens true
//
// PKG is the folder of the installed package. No special tokens are added
// (add_special_tokens false) but in ids_special mode; the added tokens in the text are split out
// first, as asyncpp's tokenizer.json imports do.
'use strict';
const fs = require('fs');
const os = require('os');
const path = require('path');
const [pkg, mode, json, ...files] = process.argv.slice(2);
const tj = JSON.parse(fs.readFileSync(json, 'utf8'));

function out(ids, decoded) {
	if (mode !== 'decode')
		console.log(ids.join(' '));
	else
		process.stdout.write(decoded);
}

if (fs.existsSync(path.join(pkg, 'dist', 'tokenizers.cjs'))) { // the JavaScript port
	const { Tokenizer } = require(path.join(pkg, 'dist', 'tokenizers.cjs'));
	const t = new Tokenizer(tj, {});
	for (const file of files) {
		const ids = t.encode(fs.readFileSync(file, 'utf8'), { add_special_tokens: mode === 'ids_special' }).ids;
		out(ids, mode === 'decode' &&
			t.decode(ids, { skip_special_tokens: true, clean_up_tokenization_spaces: false }));
	}
} else { // the Rust library
	const { Tokenizer } = require(pkg);
	const tmp = path.join(os.tmpdir(), `spm_ref_${process.pid}.json`);
	fs.writeFileSync(tmp, JSON.stringify(tj));
	const t = Tokenizer.fromFile(tmp);
	fs.unlinkSync(tmp);
	(async () => {
		for (const file of files) {
			const text = fs.readFileSync(file, 'utf8');
			const ids = (await t.encode(text, null, { addSpecialTokens: mode === 'ids_special' })).getIds();
			out(ids, mode === 'decode' && await t.decode(ids, true));
		}
	})();
}
