// parquet_fixtures.mjs - writes testdata/parquet/: Parquet files made by two
// independent writers from the built-in corpus's first paragraphs, and the
// same rows as JSON Lines ({"text": ...}, a null as ""): docs.jsonl for the
// files of the paragraphs alone, NAME.jsonl for the others, which
// tests/scripts/tokenize_parquet.sh encodes both ways and compares.
//   hyparquet-writer (DATA_PAGE_V2): snappy with other columns, small pages
//     and row groups; gzip with nulls and empty strings; a dictionary-encoded
//     column; zstd (through the zstd command); DELTA_LENGTH_BYTE_ARRAY with
//     nulls, and DELTA_BYTE_ARRAY on strings that share prefixes and on one
//     long string repeated (each string rebuilt as it is read)
//   parquetjs-lite (DATA_PAGE v1): snappy optional with nulls; gzip and
//     uncompressed, required
// Run from the repository root after `npm install hyparquet-writer@0.17.0
// parquetjs-lite@0.8.7` (in any folder on NODE_PATH, e.g. cd /tmp/pq &&
// npm install ... && NODE_PATH=/tmp/pq/node_modules node
// tests/parquet_fixtures.mjs); commit what it writes.
import { createRequire } from 'module'
import fs from 'fs'
import path from 'path'
import zlib from 'zlib'
import { execFileSync } from 'child_process'
const require = createRequire(path.join(process.env.NODE_PATH || '.', 'x.js'))
const { parquetWriteFile } = await import(require.resolve('hyparquet-writer'))
const parquet = require('parquetjs-lite')

const out = 'testdata/parquet'
const corpus = fs.readdirSync('testdata/corpus').sort()
	.map(f => fs.readFileSync(path.join('testdata/corpus', f), 'utf8')).join('')
const docs = corpus.split(/\n\s*\n/).map(p => p.replace(/\n/g, ' ').trim()).filter(p => p).slice(0, 60)
const withNulls = []
docs.forEach((d, i) => { withNulls.push(d); if (i % 7 == 3) withNulls.push(null); if (i % 11 == 5) withNulls.push('') })
const expect = (name, rows) => fs.writeFileSync(path.join(out, name + '.jsonl'),
	rows.map(s => JSON.stringify({ text: s === null ? '' : s })).join('\n') + '\n')
const file = name => path.join(out, name + '.parquet')

expect('docs', docs)
parquetWriteFile({ filename: file('v2_snappy'), rowGroupSize: 16, pageSize: 2048, columnData: [
	{ name: 'id', data: docs.map((_, i) => BigInt(i)), type: 'INT64' },
	{ name: 'text', data: docs, type: 'STRING' },
	{ name: 'url', data: docs.map((_, i) => 'https://example.org/' + (i % 5)), type: 'STRING' },
] })
parquetWriteFile({ filename: file('v2_gzip_nulls'), codec: 'GZIP', rowGroupSize: [10, 30], pageSize: 1024,
	compressors: { GZIP: b => new Uint8Array(zlib.gzipSync(b)) },
	columnData: [{ name: 'text', data: withNulls, type: 'STRING' }] })
expect('v2_gzip_nulls', withNulls)
const rep = docs.slice(0, 20).flatMap(d => [d.slice(0, 40), 'same line', 'same line'])
parquetWriteFile({ filename: file('v2_dictionary'), columnData: [{ name: 'text', data: rep, type: 'STRING' }] })
expect('v2_dictionary', rep)
parquetWriteFile({ filename: file('v2_zstd'), codec: 'ZSTD', rowGroupSize: 25, pageSize: 4096,
	compressors: { ZSTD: b => new Uint8Array(execFileSync('zstd', ['-c', '-q', '-3'], { input: Buffer.from(b) })) },
	columnData: [{ name: 'text', data: docs, type: 'STRING', nullable: false }] })

parquetWriteFile({ filename: file('v2_delta_length_nulls'), pageSize: 2048, rowGroupSize: 30,
	columnData: [{ name: 'text', data: withNulls, type: 'STRING', encoding: 'DELTA_LENGTH_BYTE_ARRAY' }] })
const urls = docs.map((d, i) => 'https://example.org/articles/' + (i % 13) + '/' + d.slice(0, 20))
parquetWriteFile({ filename: file('v2_delta_prefixes'), pageSize: 512,
	columnData: [{ name: 'text', data: urls, type: 'STRING', encoding: 'DELTA_BYTE_ARRAY', nullable: false }] })
expect('v2_delta_prefixes', urls)
// one 100 KB string 2800 times in one page: 280 MB once rebuilt, from 5 KB
parquetWriteFile({ filename: file('v2_delta_repeats'), pageSize: 0, rowGroupSize: 100000,
	columnData: [{ name: 'text', data: Array(2800).fill('word '.repeat(20000)), type: 'STRING',
		       encoding: 'DELTA_BYTE_ARRAY' }] })

async function v1(name, compression, optional, rows) {
	const schema = new parquet.ParquetSchema({ n: { type: 'INT32' }, text: { type: 'UTF8', compression, optional } })
	const w = await parquet.ParquetWriter.openFile(schema, file(name))
	w.setRowGroupSize(20)
	for (let i = 0; i < rows.length; i++)
		await w.appendRow(rows[i] === null ? { n: i } : { n: i, text: rows[i] })
	await w.close()
	if (rows !== docs)
		expect(name, rows)
}
const v1Nulls = []
docs.forEach((d, i) => { v1Nulls.push(d); if (i % 9 == 4) v1Nulls.push(null) })
await v1('v1_snappy_nulls', 'SNAPPY', true, v1Nulls)
await v1('v1_gzip', 'GZIP', false, docs)
await v1('v1_plain', 'UNCOMPRESSED', false, docs)
