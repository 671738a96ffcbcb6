// tokenizer_tiktoken_ref.js - the reference tiktoken encoder (the npm package
// tiktoken: OpenAI's Rust tiktoken built to WebAssembly) for asyncpp's tests
// and benchmark. Not a test itself (tests/run runs *.sh).
//
//   node tokenizer_tiktoken_ref.js PKG ranks ENC        ENC's rank file (.tiktoken) to stdout
//   node tokenizer_tiktoken_ref.js PKG ids ENC FILE     ids of FILE, space-separated
//   node tokenizer_tiktoken_ref.js PKG bench ENC FILE   encoding speed: "MB/s N"
//
// PKG is the folder of the installed package, ENC cl100k_base or o200k_base.
// The package holds the ranks as lines "! FIRST_RANK BASE64 BASE64 ...";
// encode_ordinary() treats special tokens' text as text, as asyncpp does.
'use strict';
const fs = require('fs');
const path = require('path');
const [pkg, mode, enc, file] = process.argv.slice(2);
const data = require(path.join(pkg, 'encoders', enc + '.json'));

if (mode === 'ranks') {
	const out = [];
	for (const line of data.bpe_ranks.split('\n')) {
		const f = line.split(' ').filter((x) => x.length);
		if (!f.length)
			continue;
		let rank = Number(f[1]);
		for (const b64 of f.slice(2))
			out.push(b64 + ' ' + rank++);
	}
	process.stdout.write(out.join('\n') + '\n');
	process.exit(0);
}

const { Tiktoken } = require(path.join(pkg, 'lite', 'tiktoken.cjs'));
const t = new Tiktoken(data.bpe_ranks, data.special_tokens, data.pat_str);
const text = fs.readFileSync(file, 'utf8');
if (mode === 'ids') {
	console.log(Array.from(t.encode_ordinary(text)).join(' '));
} else if (mode === 'bench') {
	const bytes = Buffer.byteLength(text, 'utf8');
	t.encode_ordinary(text.slice(0, 100000)); // warm up
	const t0 = process.hrtime.bigint();
	const n = t.encode_ordinary(text).length;
	const s = Number(process.hrtime.bigint() - t0) / 1e9;
	console.log((bytes / 1e6 / s).toFixed(2) + ' ' + n);
}
t.free();
