// tokenizer_gpt2_ref.js - the reference GPT-2 encoder (npm gpt-3-encoder) for
// asyncpp's tests and benchmark. Not a test itself (tests/run runs *.sh).
//
//   node tokenizer_gpt2_ref.js PKG ids FILE     ids of FILE, space-separated
//   node tokenizer_gpt2_ref.js PKG table        testdata/gpt2_ids.txt to stdout
//   node tokenizer_gpt2_ref.js PKG bench FILE   encoding speed: "MB/s N"
//
// PKG is the folder of the installed gpt-3-encoder package. Its encode() is
// quadratic in the text length (it concatenates arrays), so long texts are
// cut right after a '\n' that has a printable ASCII character on each side;
// GPT-2's pre-tokenizer makes that '\n' a piece of its own whether the text
// goes on or ends there, so the ids are the same as encoding the whole text
// at once. (Not so after "\n\n": at the end of a text that run is one piece.)
'use strict';
const fs = require('fs');
const [pkg, mode, file] = process.argv.slice(2);
const { encode } = require(pkg);

function pieces(text) {
	const out = [];
	let start = 0;
	for (let i = 1; i < text.length; i++) {
		const c = text.charCodeAt(i);
		const b = text.charCodeAt(i - 2);
		if (text.charCodeAt(i - 1) === 10 && c > 32 && c < 127 && b > 32 && b < 127 &&
		    i - start >= 4096) {
			out.push(text.slice(start, i));
			start = i;
		}
	}
	out.push(text.slice(start));
	return out;
}

function encodeAll(text) {
	const ids = [];
	for (const p of pieces(text))
		for (const id of encode(p))
			ids.push(id);
	return ids;
}

// Strings that exercise contractions, whitespace runs, numbers and Unicode.
const TRICKY = [
	"Hello world", "Hello, world!", " leading space", "trailing space ", "  two leading",
	"I'll", "don't", "she'd've", "It'S", "can't won't", "'s 't 're 've 'm 'll 'd", "''quoted''",
	"rock 'n' roll", "y'all's", "a  b", "a   b", "a\tb", "a \t b", "line\nbreak", "a\n\nb",
	"a \n b", "a\r\nb\r\n", "   ", "\n", "\n\n\n", "\t\t\tx", "x\n  \n  y", "end  ",
	"12345", "3.14159", " 2023", "$100,000.00", "1st 2nd 3rd", "0x1F", "x²+y³", "½ ¼",
	"Ⅻ", "٣٤٥", "१२३", "café", "naïve résumé", "Ünïcödé", "straße", "Ελληνικά", "Кириллица",
	"你好世界", "日本語のテキスト", "한국어", "עברית", "العربية", "हिन्दी", "ไทย",
	"👋🏽 hi", "👨‍👩‍👧", "🙂🙂🙂", "a\u00a0b", "a\u3000b", "a\u2028b", "\ufeffBOM",
	"a\u0085b", "a\u001cb", "e\u0301", "x\u200by", "<|endoftext|>", "def f(x):\n\treturn x**2\n",
	"https://example.com/a?b=c&d=e", "user@example.com", "!!!???...", "--- ***", "(a) [b] {c}",
	"\"quote\" 'single'", "#hashtag @mention", "C++ and C#", "tab\there", "MiXeD CaSe",
	"ALLCAPS", "snake_case_name", "camelCaseName", "    indented code", "a.b.c", "...",
];

if (mode === 'ids') {
	console.log(encodeAll(fs.readFileSync(file, 'utf8')).join(' '));
} else if (mode === 'table') {
	console.log('# GPT-2 ids of tricky strings, from the npm gpt-3-encoder.');
	console.log('# Regenerate: node tests/scripts/tokenizer_gpt2_ref.js PKG table');
	console.log('# Each case: a comment with the string, then HEX-OF-UTF8 TAB IDS.');
	for (const s of TRICKY) {
		console.log('# ' + JSON.stringify(s));
		console.log(Buffer.from(s, 'utf8').toString('hex') + '\t' + encode(s).join(' '));
	}
} else if (mode === 'bench') {
	const text = fs.readFileSync(file, 'utf8');
	const bytes = Buffer.byteLength(text, 'utf8');
	const t0 = process.hrtime.bigint();
	const n = encodeAll(text).length;
	const dt = Number(process.hrtime.bigint() - t0) / 1e9;
	console.log((bytes / 1e6 / dt).toFixed(3) + ' ' + n);
} else {
	console.error('usage: node tokenizer_gpt2_ref.js PKG ids|table|bench [FILE]');
	process.exit(2);
}
