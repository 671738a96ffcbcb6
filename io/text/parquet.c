/* parquet.c - one string column of a Parquet file (parquet.h).
 *
 * Three layers: a Thrift compact-protocol reader (the footer's FileMetaData
 * and each page's PageHeader), the column's chunks and pages, and the
 * decoders of levels (RLE/bit-packed hybrid) and values (PLAIN, dictionary).
 */
#include "parquet.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include "../util.h"
#include "snappy.h"

/* ---- Thrift compact protocol ---- */

enum { T_STOP, T_TRUE, T_FALSE, T_I8, T_I16, T_I32, T_I64, T_DOUBLE, T_BINARY, T_LIST, T_SET,
       T_MAP, T_STRUCT };

struct thrift {
	const uint8_t *p, *end;
	int bad;
};

static uint64_t t_varint(struct thrift *t)
{
	uint64_t v = 0;
	for (int shift = 0; shift < 64; shift += 7) {
		if (t->p >= t->end)
			break;
		uint8_t b = *t->p++;
		v |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80))
			return v;
	}
	t->bad = 1;
	return 0;
}

static int64_t t_zigzag(struct thrift *t)
{
	uint64_t v = t_varint(t);
	return (int64_t)(v >> 1) ^ -(int64_t)(v & 1);
}

/* A binary's bytes: the pointer (into the file), its length in *n. */
static const uint8_t *t_binary(struct thrift *t, size_t *n)
{
	uint64_t len = t_varint(t);
	if (t->bad || len > (uint64_t)(t->end - t->p)) {
		t->bad = 1;
		*n = 0;
		return NULL;
	}
	const uint8_t *s = t->p;
	t->p += len;
	*n = (size_t)len;
	return s;
}

/* A list (or set) header: its element type, the count in *n. */
static int t_list(struct thrift *t, uint64_t *n)
{
	if (t->p >= t->end) {
		t->bad = 1;
		*n = 0;
		return 0;
	}
	uint8_t b = *t->p++;
	*n = b >> 4;
	if (*n == 15)
		*n = t_varint(t);
	/* every element takes at least one byte (or none for booleans in a
	 * struct, which lists do not hold): a count beyond the bytes left is
	 * corrupt */
	if (*n > (uint64_t)(t->end - t->p))
		t->bad = 1;
	return b & 0x0f;
}

/* A field header of a struct whose last field id is *id: the type (T_STOP
 * at the end), the id in *id. */
static int t_field(struct thrift *t, int *id)
{
	if (t->p >= t->end) {
		t->bad = 1;
		return T_STOP;
	}
	uint8_t b = *t->p++;
	int type = b & 0x0f, delta = b >> 4;
	if (type == T_STOP)
		return T_STOP;
	*id = delta ? *id + delta : (int)t_zigzag(t);
	return type;
}

static void t_skip(struct thrift *t, int type, int depth);

static void t_skip_struct(struct thrift *t, int depth)
{
	int id = 0, type;
	while (!t->bad && (type = t_field(t, &id)) != T_STOP)
		t_skip(t, type, depth + 1);
}

/* Skip a value of the type (depth bounds nesting in a hostile file). */
static void t_skip(struct thrift *t, int type, int depth)
{
	size_t n;
	uint64_t count;
	if (depth > 32) {
		t->bad = 1;
		return;
	}
	switch (type) {
	case T_TRUE:
	case T_FALSE:
		break;
	case T_I8:
		if (t->p >= t->end)
			t->bad = 1;
		else
			t->p++;
		break;
	case T_I16:
	case T_I32:
	case T_I64:
		t_varint(t);
		break;
	case T_DOUBLE:
		if (t->end - t->p < 8)
			t->bad = 1;
		else
			t->p += 8;
		break;
	case T_BINARY:
		t_binary(t, &n);
		break;
	case T_LIST:
	case T_SET: {
		int et = t_list(t, &count);
		for (uint64_t i = 0; i < count && !t->bad; i++)
			t_skip(t, et == T_TRUE || et == T_FALSE ? T_I8 : et, depth + 1);
		break;
	}
	case T_MAP: {
		count = t_varint(t);
		if (!count)
			break;
		if (t->p >= t->end || count > (uint64_t)(t->end - t->p)) {
			t->bad = 1;
			break;
		}
		uint8_t kv = *t->p++;
		int kt = kv >> 4, vt = kv & 0x0f;
		for (uint64_t i = 0; i < count && !t->bad; i++) { /* booleans: a byte each */
			t_skip(t, kt == T_TRUE || kt == T_FALSE ? T_I8 : kt, depth + 1);
			t_skip(t, vt == T_TRUE || vt == T_FALSE ? T_I8 : vt, depth + 1);
		}
		break;
	}
	case T_STRUCT:
		t_skip_struct(t, depth);
		break;
	default:
		t->bad = 1;
	}
}

/* ---- metadata ---- */

enum { TYPE_BYTE_ARRAY = 6 };
enum { REP_REQUIRED, REP_OPTIONAL, REP_REPEATED };
enum { CODEC_UNCOMPRESSED, CODEC_SNAPPY, CODEC_GZIP, CODEC_LZO, CODEC_BROTLI, CODEC_LZ4,
       CODEC_ZSTD, CODEC_LZ4_RAW };
enum { PAGE_DATA, PAGE_INDEX, PAGE_DICTIONARY, PAGE_DATA_V2 };
enum { ENC_PLAIN = 0, ENC_PLAIN_DICTIONARY = 2, ENC_RLE = 3, ENC_DELTA_LENGTH_BYTE_ARRAY = 6,
       ENC_DELTA_BYTE_ARRAY = 7, ENC_RLE_DICTIONARY = 8 };

static const char *codec_name(int c)
{
	static const char *const names[] = {"UNCOMPRESSED", "SNAPPY", "GZIP", "LZO",
					    "BROTLI",       "LZ4",    "ZSTD", "LZ4_RAW"};
	return c >= 0 && c < (int)ARRAY_SIZE(names) ? names[c] : "an unknown codec";
}

static const char *encoding_name(int e)
{
	static const char *const names[] = {"PLAIN", "GROUP_VAR_INT", "PLAIN_DICTIONARY", "RLE",
					    "BIT_PACKED", "DELTA_BINARY_PACKED",
					    "DELTA_LENGTH_BYTE_ARRAY", "DELTA_BYTE_ARRAY",
					    "RLE_DICTIONARY", "BYTE_STREAM_SPLIT"};
	return e >= 0 && e < (int)ARRAY_SIZE(names) ? names[e] : "an unknown encoding";
}

/* The chunk of our column in one row group. */
struct chunk {
	int64_t rows, values;       /* the row group's rows, the chunk's values */
	int64_t start, size;        /* first page (dictionary or data), compressed bytes */
	int codec;
};

struct parquet {
	const char *name;           /* for messages */
	char *name_copy;
	const uint8_t *data;        /* the file */
	size_t len;
	void *map;                  /* data when parquet_open mapped it */
	const char *column;
	int max_def;                /* 0: REQUIRED, 1: OPTIONAL */
	uint64_t rows;
	struct chunk *chunks;
	int n_chunks;

	/* reading: chunk ci, its next page at pos; values_left in the chunk */
	int ci;
	int64_t pos, chunk_end, values_left;
	/* the chunk's dictionary: entries into dict_buf (or the file) */
	uint8_t *dict_buf;
	const uint8_t **dict_s;
	uint32_t *dict_n;
	uint32_t dict_len;
	int has_dict;
	/* the page being read: its decoded values */
	uint8_t *page_buf;          /* decompressed page (NULL: the file's bytes) */
	const uint8_t **val_s;      /* NULL: a null */
	uint32_t *val_n;
	uint32_t page_len, page_next;
	size_t val_cap;
	/* DELTA_BYTE_ARRAY: val_s/val_n hold each string's suffix and
	 * val_pre its prefix length; parquet_next rebuilds the string in cur
	 * (which holds the previous one), so memory is the longest string */
	uint32_t *val_pre;
	int prefixed;               /* the page is DELTA_BYTE_ARRAY */
	size_t pre_cap;
	struct buf cur;
	int failed;                 /* an error was reported: every call fails */
};

static int bad(const struct parquet *p, const char *why)
{
	return error("'%s': not a valid Parquet file: %s", p->name, why);
}

/* One SchemaElement: what we need of it. */
struct schema_el {
	int type, rep, children;
	const uint8_t *name;
	size_t name_len;
};

static void read_schema_el(struct thrift *t, struct schema_el *e)
{
	memset(e, 0, sizeof(*e));
	e->type = -1;
	int id = 0, type;
	while (!t->bad && (type = t_field(t, &id)) != T_STOP) {
		if (id == 1 && type == T_I32)
			e->type = (int)t_zigzag(t);
		else if (id == 3 && type == T_I32)
			e->rep = (int)t_zigzag(t);
		else if (id == 4 && type == T_BINARY)
			e->name = t_binary(t, &e->name_len);
		else if (id == 5 && type == T_I32)
			e->children = (int)t_zigzag(t);
		else
			t_skip(t, type, 1);
	}
}

/* The schema: find the top-level leaf named p->column; *leaf gets its index
 * among the leaves (the chunk order of a row group). */
static int read_schema(struct parquet *p, struct thrift *t, int *leaf)
{
	uint64_t n;
	int et = t_list(t, &n);
	if (t->bad || et != T_STRUCT || n < 1)
		return bad(p, "no schema");
	struct schema_el root;
	read_schema_el(t, &root);
	/* a walk of the tree in file order (depth first): pending[d] counts the
	 * children still to come at depth d */
	int pending[64], depth = 0, leaves = 0, found = -1;
	pending[0] = root.children;
	struct buf strings = {0}; /* the top-level string columns, for a message */
	int rc = 0;
	for (uint64_t i = 1; !rc && i < n && !t->bad; i++) {
		while (depth > 0 && pending[depth] == 0)
			depth--;
		if (pending[depth] == 0) {
			rc = bad(p, "the schema has more elements than the root's children");
			break;
		}
		pending[depth]--;
		struct schema_el e;
		read_schema_el(t, &e);
		int top = depth == 0;
		int match = top && e.name_len == strlen(p->column) &&
			    !memcmp(e.name, p->column, e.name_len);
		if (e.children > 0 || (e.children == 0 && e.type < 0)) { /* a group */
			if (match)
				rc = error("'%s': column '%s' is a group (nested), not strings: choose "
					   "a top-level string column with --field", p->name, p->column);
			else if (depth + 1 >= (int)ARRAY_SIZE(pending))
				rc = bad(p, "schema nested too deep");
			else if (e.children > 0)
				pending[++depth] = e.children;
			continue;
		}
		if (top && e.type == TYPE_BYTE_ARRAY && e.rep != REP_REPEATED && strings.len < 400) {
			buf_append(&strings, strings.len ? ", " : "", strings.len ? 2 : 0);
			buf_append(&strings, e.name ? (const char *)e.name : "", e.name_len);
		}
		if (match) {
			if (e.type != TYPE_BYTE_ARRAY)
				rc = error("'%s': column '%s' does not hold strings (Parquet type %d, "
					   "not BYTE_ARRAY)", p->name, p->column, e.type);
			else if (e.rep == REP_REPEATED)
				rc = error("'%s': column '%s' is repeated (a list), not one string a "
					   "row", p->name, p->column);
			p->max_def = e.rep == REP_OPTIONAL;
			found = leaves;
		}
		leaves++;
	}
	if (rc)
		; /* said */
	else if (t->bad)
		rc = bad(p, "the schema is cut short");
	else if (found < 0 && strings.len)
		rc = error("'%s': no top-level column '%s'; its string columns are %.*s (choose "
			   "the text column with --field)", p->name, p->column, (int)strings.len,
			   (const char *)strings.data);
	else if (found < 0)
		rc = error("'%s': no top-level column '%s', and no top-level string column",
			   p->name, p->column);
	buf_free(&strings);
	if (rc)
		return -1;
	*leaf = found;
	return 0;
}

/* ColumnMetaData: the chunk's codec, values, sizes and first page. */
static void read_column_meta(struct thrift *t, struct chunk *c, int *type, int64_t *data_off,
			     int64_t *dict_off)
{
	int id = 0, ft;
	while (!t->bad && (ft = t_field(t, &id)) != T_STOP) {
		if (id == 1 && ft == T_I32)
			*type = (int)t_zigzag(t);
		else if (id == 4 && ft == T_I32)
			c->codec = (int)t_zigzag(t);
		else if (id == 5 && ft == T_I64)
			c->values = t_zigzag(t);
		else if (id == 7 && ft == T_I64)
			c->size = t_zigzag(t);
		else if (id == 9 && ft == T_I64)
			*data_off = t_zigzag(t);
		else if (id == 11 && ft == T_I64)
			*dict_off = t_zigzag(t);
		else
			t_skip(t, ft, 1);
	}
}

/* One RowGroup: our leaf's chunk into c. */
static int read_row_group(struct parquet *p, struct thrift *t, int leaf, struct chunk *c)
{
	memset(c, 0, sizeof(*c));
	c->values = c->size = -1;
	int64_t data_off = -1, dict_off = -1;
	int type = -1, id = 0, ft, seen = 0, external = 0;
	while (!t->bad && (ft = t_field(t, &id)) != T_STOP) {
		if (id == 1 && ft == T_LIST) {
			uint64_t n;
			int et = t_list(t, &n);
			if (et != T_STRUCT)
				t->bad = 1;
			for (uint64_t i = 0; i < n && !t->bad; i++) {
				int cid = 0, cft;
				while (!t->bad && (cft = t_field(t, &cid)) != T_STOP) {
					if ((int)i == leaf && cid == 1 && cft == T_BINARY) {
						size_t len;
						t_binary(t, &len);
						external = len > 0; /* an empty path is this file */
					} else if ((int)i == leaf && cid == 3 && cft == T_STRUCT) {
						read_column_meta(t, c, &type, &data_off, &dict_off);
						seen = 1;
					} else {
						t_skip(t, cft, 2);
					}
				}
			}
		} else if (id == 3 && ft == T_I64) {
			c->rows = t_zigzag(t);
		} else {
			t_skip(t, ft, 1);
		}
	}
	if (t->bad)
		return bad(p, "a row group's metadata is cut short");
	if (external)
		return error("'%s': column '%s' is stored in another file (ColumnChunk.file_path), "
			     "which is not read", p->name, p->column);
	if (!seen || type != TYPE_BYTE_ARRAY)
		return bad(p, "a row group lacks the column's metadata");
	if (c->values == 0) { /* pyarrow's empty table: no data page, offsets 0 */
		c->start = c->size = 0;
		return 0;
	}
	c->start = dict_off > 0 && (data_off <= 0 || dict_off < data_off) ? dict_off : data_off;
	if (c->rows < 0 || c->values < 0 || c->size < 0 || c->start < 4 ||
	    (uint64_t)c->start > p->len || (uint64_t)c->size > p->len - (uint64_t)c->start)
		return bad(p, "a column chunk lies outside the file");
	if (c->codec != CODEC_UNCOMPRESSED && c->codec != CODEC_SNAPPY && c->codec != CODEC_GZIP &&
	    c->codec != CODEC_ZSTD)
		return error("'%s': column '%s' is compressed with %s, which is not supported "
			     "(UNCOMPRESSED, SNAPPY, GZIP and ZSTD are)", p->name, p->column,
			     codec_name(c->codec));
	return 0;
}

static int read_footer(struct parquet *p)
{
	if (p->len < 12 || memcmp(p->data, "PAR1", 4) || memcmp(p->data + p->len - 4, "PAR1", 4))
		return error("'%s': not a Parquet file (no PAR1 magic at its start and end); from "
			     "a dataset's folder, name its Parquet files with a glob such as "
			     "'DIR/*.parquet'", p->name);
	uint32_t meta_len = get_le32(p->data + p->len - 8);
	if (meta_len > p->len - 12)
		return bad(p, "the footer's length exceeds the file");
	struct thrift t = {p->data + p->len - 8 - meta_len, p->data + p->len - 8, 0};
	int id = 0, ft, leaf = -1, have_schema = 0;
	while (!t.bad && (ft = t_field(&t, &id)) != T_STOP) {
		if (id == 2 && ft == T_LIST) {
			if (have_schema)
				return bad(p, "two schemas");
			if (read_schema(p, &t, &leaf))
				return -1;
			have_schema = 1;
		} else if (id == 3 && ft == T_I64) {
			int64_t rows = t_zigzag(&t);
			p->rows = rows > 0 ? (uint64_t)rows : 0;
		} else if (id == 4 && ft == T_LIST) {
			if (!have_schema)
				return bad(p, "row groups before the schema");
			if (p->chunks)
				return bad(p, "two lists of row groups");
			uint64_t n;
			if (t_list(&t, &n) != T_STRUCT && n)
				t.bad = 1;
			if (t.bad)
				break;
			p->chunks = xcalloc((size_t)n ? (size_t)n : 1, sizeof(*p->chunks));
			for (uint64_t i = 0; i < n; i++)
				if (read_row_group(p, &t, leaf, &p->chunks[p->n_chunks++]))
					return -1;
		} else {
			t_skip(&t, ft, 1);
		}
	}
	if (t.bad)
		return bad(p, "the footer is cut short or corrupt");
	if (!have_schema)
		return bad(p, "no schema");
	return 0;
}

/* ---- pages ---- */

/* Decompress src[0..n) with the chunk's codec into p->page_buf, exactly
 * out_len bytes. */
static int decompress(struct parquet *p, int codec, const uint8_t *src, size_t n, size_t out_len,
		      uint8_t **out)
{
	free(*out);
	*out = xmalloc(out_len ? out_len : 1);
	int ok = 0;
	if (codec == CODEC_SNAPPY) {
		ok = !snappy_uncompress(src, n, *out, out_len);
	} else if (codec == CODEC_ZSTD) {
		size_t r = ZSTD_decompress(*out, out_len, src, n);
		ok = !ZSTD_isError(r) && r == out_len;
	} else if (codec == CODEC_GZIP) {
		z_stream z;
		memset(&z, 0, sizeof(z));
		if (inflateInit2(&z, 15 + 32) == Z_OK) { /* gzip or zlib header */
			z.next_in = (Bytef *)src;
			z.avail_in = (uInt)n;
			z.next_out = *out;
			z.avail_out = (uInt)out_len;
			int r = inflate(&z, Z_FINISH);
			ok = r == Z_STREAM_END && z.total_out == out_len && n <= 0xffffffffu &&
			     out_len <= 0xffffffffu;
			inflateEnd(&z);
		}
	}
	if (!ok)
		return error("'%s': a page of column '%s' does not decompress (%s): the file is "
			     "damaged", p->name, p->column, codec_name(codec));
	return 0;
}

/* RLE/bit-packed hybrid (levels and dictionary indices), bit width bw. */
struct hybrid {
	const uint8_t *p, *end;
	int bw;
	uint32_t left, value;       /* run: values left; an RLE run's value */
	const uint8_t *packed;      /* a bit-packed run's bytes, NULL for RLE */
	uint64_t bit;
};

static int hybrid_next(struct hybrid *h, uint32_t *v)
{
	if (!h->left) {
		struct thrift t = {h->p, h->end, 0};
		uint64_t header = t_varint(&t);
		if (t.bad)
			return -1;
		h->p = t.p;
		if (header & 1) {
			uint64_t groups = header >> 1, bytes = groups * (uint64_t)h->bw;
			if (!groups || groups > (1u << 28) || bytes > (uint64_t)(h->end - h->p))
				return -1;
			h->packed = h->p;
			h->bit = 0;
			h->p += bytes;
			h->left = (uint32_t)(groups * 8);
		} else {
			uint64_t count = header >> 1;
			size_t vb = ((size_t)h->bw + 7) / 8;
			if (!count || count > 0xffffffffu || vb > (size_t)(h->end - h->p))
				return -1;
			h->value = 0;
			for (size_t i = 0; i < vb; i++)
				h->value |= (uint32_t)h->p[i] << (8 * i);
			h->p += vb;
			h->packed = NULL;
			h->left = (uint32_t)count;
		}
	}
	h->left--;
	if (!h->packed) {
		*v = h->value;
		return 0;
	}
	uint32_t x = 0;
	for (int b = 0; b < h->bw; b++, h->bit++)
		x |= (uint32_t)(h->packed[h->bit >> 3] >> (h->bit & 7) & 1) << b;
	*v = x;
	return 0;
}

static int page_error(struct parquet *p, const char *why)
{
	return error("'%s': column '%s', row group %d: %s", p->name, p->column, p->ci + 1, why);
}

/* PLAIN BYTE_ARRAY values: n of them from src[0..len) into s[], lens[];
 * a null (defs[i] 0, when there are levels) as NULL. */
static int plain_values(struct parquet *p, const uint8_t *src, size_t len, uint32_t n,
			const uint8_t **s, uint32_t *lens, const uint32_t *defs)
{
	size_t pos = 0;
	for (uint32_t i = 0; i < n; i++) {
		if (defs && !defs[i]) {
			s[i] = NULL;
			lens[i] = 0;
			continue;
		}
		if (len - pos < 4)
			return page_error(p, "its values end early");
		uint32_t k = get_le32(src + pos);
		pos += 4;
		if (k > len - pos)
			return page_error(p, "a string runs past its page");
		s[i] = src + pos;
		lens[i] = k;
		pos += k;
	}
	return 0;
}

/* The chunk's dictionary page (PLAIN strings). */
static int read_dictionary(struct parquet *p, const uint8_t *body, size_t page_bytes,
			   uint32_t num, int enc)
{
	if (enc != ENC_PLAIN && enc != ENC_PLAIN_DICTIONARY)
		return page_error(p, "its dictionary is not PLAIN-encoded");
	if (num > page_bytes / 4)
		return page_error(p, "its dictionary claims more strings than it holds");
	free(p->dict_s);
	free(p->dict_n);
	p->dict_s = xmalloc(st_mult(num ? num : 1, sizeof(*p->dict_s)));
	p->dict_n = xmalloc(st_mult(num ? num : 1, sizeof(*p->dict_n)));
	p->has_dict = 0;
	if (plain_values(p, body, page_bytes, num, p->dict_s, p->dict_n, NULL))
		return -1;
	p->dict_len = num;
	p->has_dict = 1;
	return 0;
}

/* Make room for n decoded values of a page. */
static void reserve_values(struct parquet *p, uint32_t n)
{
	if (n <= p->val_cap)
		return;
	p->val_cap = n;
	p->val_s = xrealloc(p->val_s, st_mult(n, sizeof(*p->val_s)));
	p->val_n = xrealloc(p->val_n, st_mult(n, sizeof(*p->val_n)));
}

/* DELTA_BINARY_PACKED: n integers from src[0..len) into out[n]; *used
 * gets the bytes the encoding took (its header counts at least n). -1 for
 * corrupt data. */
static int delta_packed(const uint8_t *src, size_t len, uint32_t n, int64_t *out, size_t *used)
{
	struct thrift t = {src, src + len, 0};
	uint64_t block = t_varint(&t), minis = t_varint(&t), total = t_varint(&t);
	uint64_t v = (uint64_t)t_zigzag(&t); /* unsigned: wraps as the writers' sums do */
	if (t.bad || !minis || minis > 1024 || block == 0 || block > (1u << 20) ||
	    block % minis || (block / minis) % 8 || total != n)
		return -1;
	uint64_t per = block / minis;
	uint32_t i = 0;
	if (n)
		out[i++] = (int64_t)v;
	while (i < n) {
		uint64_t min_delta = (uint64_t)t_zigzag(&t);
		if (t.bad || (uint64_t)(t.end - t.p) < minis)
			return -1;
		const uint8_t *widths = t.p;
		t.p += minis;
		for (uint64_t m = 0; m < minis && i < n; m++) {
			int bw = widths[m];
			uint64_t bytes = per * (uint64_t)bw / 8;
			if (bw > 64 || bytes > (uint64_t)(t.end - t.p))
				return -1;
			for (uint64_t k = 0; k < per && i < n; k++) {
				uint64_t x = 0, bit = k * (uint64_t)bw;
				for (int b = 0; b < bw; b++, bit++)
					x |= (uint64_t)(t.p[bit >> 3] >> (bit & 7) & 1) << b;
				v += min_delta + x;
				out[i++] = (int64_t)v;
			}
			t.p += bytes;
		}
	}
	*used = (size_t)(t.p - src);
	return 0;
}

/* DELTA_LENGTH_BYTE_ARRAY (lengths, then the bytes) and DELTA_BYTE_ARRAY
 * (prefix lengths, then the suffixes as DELTA_LENGTH_BYTE_ARRAY; each
 * string is the previous one's first prefix bytes and its suffix): the
 * present values of a page, nulls where defs says. DELTA_BYTE_ARRAY's
 * strings are rebuilt one at a time as they are read (parquet_next). */
static int delta_strings(struct parquet *p, const uint8_t *vals, size_t len, uint32_t num,
			 const uint32_t *defs, int prefixed)
{
	uint32_t present = 0;
	for (uint32_t i = 0; i < num; i++)
		present += !defs || defs[i];
	if (!present) { /* a page of nulls may have no value section */
		for (uint32_t i = 0; i < num; i++) {
			p->val_s[i] = NULL;
			p->val_n[i] = 0;
		}
		return 0;
	}
	int64_t *pre = xmalloc(st_mult(present, sizeof(int64_t)));
	int64_t *lens = xmalloc(st_mult(present, sizeof(int64_t)));
	size_t used = 0, used2 = 0, total = 0;
	int rc = 0;
	if (prefixed && delta_packed(vals, len, present, pre, &used))
		rc = page_error(p, "its DELTA_BYTE_ARRAY prefix lengths are corrupt");
	if (!rc && delta_packed(vals + used, len - used, present, lens, &used2))
		rc = page_error(p, "its delta-encoded string lengths are corrupt");
	const uint8_t *data = vals + used + used2;
	size_t left = len - used - used2;
	for (uint32_t j = 0; !rc && j < present; j++) {
		/* a prefix is at most the previous string (the page's first has
		 * none), and a string at most a page */
		if (lens[j] < 0 || (uint64_t)lens[j] > left - total ||
		    (prefixed && (pre[j] < 0 || (j == 0 && pre[j]) ||
				  (j && pre[j] > pre[j - 1] + lens[j - 1]) ||
				  pre[j] + lens[j] > (int64_t)PARQUET_MAX_PAGE)))
			rc = page_error(p, "a delta-encoded string runs past its page");
		else
			total += (size_t)lens[j];
	}
	if (!rc && prefixed && p->pre_cap < num) {
		p->pre_cap = num;
		p->val_pre = xrealloc(p->val_pre, st_mult(num, sizeof(*p->val_pre)));
	}
	size_t off = 0;
	for (uint32_t i = 0, j = 0; !rc && i < num; i++) {
		if (defs && !defs[i]) {
			p->val_s[i] = NULL;
			p->val_n[i] = 0;
			continue;
		}
		p->val_s[i] = data + off;
		p->val_n[i] = (uint32_t)lens[j];
		if (prefixed)
			p->val_pre[i] = (uint32_t)pre[j];
		off += (size_t)lens[j];
		j++;
	}
	free(pre);
	free(lens);
	return rc;
}

/* Decode a data page's values: defs then values from body. */
static int data_values(struct parquet *p, uint32_t num, int enc, const uint8_t *defs_p,
		       size_t defs_len, const uint8_t *vals, size_t vals_len)
{
	reserve_values(p, num);
	uint32_t *defs = NULL;
	int prefixed = 0;
	if (p->max_def) {
		defs = xmalloc(st_mult(num ? num : 1, sizeof(*defs)));
		struct hybrid h = {defs_p, defs_p + defs_len, 1, 0, 0, NULL, 0};
		for (uint32_t i = 0; i < num; i++)
			if (hybrid_next(&h, &defs[i]) || defs[i] > 1) {
				free(defs);
				return page_error(p, "its definition levels are corrupt");
			}
	}
	int rc = 0;
	if (enc == ENC_PLAIN) {
		rc = plain_values(p, vals, vals_len, num, p->val_s, p->val_n, defs);
	} else if (enc == ENC_PLAIN_DICTIONARY || enc == ENC_RLE_DICTIONARY) {
		/* the indices' bit width comes first; a page of nulls may have none */
		struct hybrid h = {vals + (vals_len > 0), vals + vals_len, vals_len ? vals[0] : 0, 0, 0,
				   NULL, 0};
		for (uint32_t i = 0; !rc && i < num; i++) {
			uint32_t k;
			if (defs && !defs[i]) {
				p->val_s[i] = NULL;
				p->val_n[i] = 0;
			} else if (!p->has_dict) {
				rc = page_error(p, "a dictionary-encoded page comes without a dictionary");
			} else if (vals_len < 1 || vals[0] > 32) {
				rc = page_error(p, "its dictionary indices are corrupt");
			} else if (hybrid_next(&h, &k) || k >= p->dict_len) {
				rc = page_error(p, "a dictionary index is corrupt or out of range");
			} else {
				p->val_s[i] = p->dict_s[k];
				p->val_n[i] = p->dict_n[k];
			}
		}
	} else if (enc == ENC_DELTA_LENGTH_BYTE_ARRAY || enc == ENC_DELTA_BYTE_ARRAY) {
		rc = delta_strings(p, vals, vals_len, num, defs, enc == ENC_DELTA_BYTE_ARRAY);
		prefixed = enc == ENC_DELTA_BYTE_ARRAY;
	} else {
		rc = error("'%s': column '%s' is encoded %s, which is not supported (PLAIN, "
			   "dictionary and DELTA_(LENGTH_)BYTE_ARRAY encodings are)", p->name,
			   p->column, encoding_name(enc));
	}
	free(defs);
	if (!rc) {
		p->page_len = num;
		p->page_next = 0;
		p->prefixed = prefixed;
		p->cur.len = 0;
	}
	return rc;
}

/* PageHeader fields we use. */
struct page_header {
	int type, enc, def_enc;
	int32_t usize, csize;
	int32_t num, def_len, rep_len;
	int compressed;
};

static void read_page_sub(struct thrift *t, struct page_header *h, int which)
{
	int id = 0, ft;
	while (!t->bad && (ft = t_field(t, &id)) != T_STOP) {
		if (id == 1 && ft == T_I32)
			h->num = (int32_t)t_zigzag(t);
		else if (which == PAGE_DATA && id == 2 && ft == T_I32)
			h->enc = (int)t_zigzag(t);
		else if (which == PAGE_DATA && id == 3 && ft == T_I32)
			h->def_enc = (int)t_zigzag(t);
		else if (which == PAGE_DICTIONARY && id == 2 && ft == T_I32)
			h->enc = (int)t_zigzag(t);
		else if (which == PAGE_DATA_V2 && id == 4 && ft == T_I32)
			h->enc = (int)t_zigzag(t);
		else if (which == PAGE_DATA_V2 && id == 5 && ft == T_I32)
			h->def_len = (int32_t)t_zigzag(t);
		else if (which == PAGE_DATA_V2 && id == 6 && ft == T_I32)
			h->rep_len = (int32_t)t_zigzag(t);
		else if (which == PAGE_DATA_V2 && id == 7 && (ft == T_TRUE || ft == T_FALSE))
			h->compressed = ft == T_TRUE;
		else
			t_skip(t, ft, 2);
	}
}

static int read_page_header(struct thrift *t, struct page_header *h)
{
	memset(h, 0, sizeof(*h));
	h->type = h->enc = -1;
	h->def_enc = ENC_RLE;
	h->compressed = 1;
	int id = 0, ft;
	while (!t->bad && (ft = t_field(t, &id)) != T_STOP) {
		if (id == 1 && ft == T_I32)
			h->type = (int)t_zigzag(t);
		else if (id == 2 && ft == T_I32)
			h->usize = (int32_t)t_zigzag(t);
		else if (id == 3 && ft == T_I32)
			h->csize = (int32_t)t_zigzag(t);
		else if (id == 5 && ft == T_STRUCT)
			read_page_sub(t, h, PAGE_DATA);
		else if (id == 7 && ft == T_STRUCT)
			read_page_sub(t, h, PAGE_DICTIONARY);
		else if (id == 8 && ft == T_STRUCT)
			read_page_sub(t, h, PAGE_DATA_V2);
		else
			t_skip(t, ft, 1);
	}
	return t->bad ? -1 : 0;
}

/* Read pages of the current chunk until one holds values: 1, or 0 when
 * the chunk is done, -1. */
static int next_page(struct parquet *p)
{
	const struct chunk *c = &p->chunks[p->ci];
	while (p->values_left > 0) {
		if (p->pos >= p->chunk_end)
			return page_error(p, "its pages end before its values do");
		struct thrift t = {p->data + p->pos, p->data + p->chunk_end, 0};
		struct page_header h;
		if (read_page_header(&t, &h))
			return page_error(p, "a page header is corrupt");
		const uint8_t *body = t.p;
		if (h.csize < 0 || h.usize < 0 || (uint64_t)h.usize > PARQUET_MAX_PAGE ||
		    h.csize > p->data + p->chunk_end - body || h.num < 0 ||
		    (uint32_t)h.num > PARQUET_MAX_VALUES)
			return page_error(p, "a page's sizes or count are out of range");
		p->pos = body + h.csize - p->data;
		if (h.type == PAGE_INDEX)
			continue;
		if (h.type != PAGE_DATA && h.type != PAGE_DICTIONARY && h.type != PAGE_DATA_V2)
			return page_error(p, "a page of an unknown type");
		const uint8_t *src = body;
		size_t src_len = (size_t)h.csize, head = 0;
		if (h.type == PAGE_DATA_V2) { /* levels first, never compressed */
			if (h.def_len < 0 || h.rep_len != 0 || h.def_len > h.csize ||
			    h.def_len > h.usize)
				return page_error(p, "a page's level lengths are out of range");
			head = (size_t)h.def_len;
			src += head;
			src_len -= head;
		}
		const uint8_t *plain = src;
		size_t plain_len = src_len;
		size_t want = (size_t)h.usize - head;
		if (want == 0 && h.type == PAGE_DATA_V2) {
			/* an all-null page: no values to decompress (parquet-java
			 * writes 0 bytes here, compressed or not) */
			plain_len = 0;
		} else if (c->codec != CODEC_UNCOMPRESSED && (h.type != PAGE_DATA_V2 || h.compressed)) {
			if (decompress(p, c->codec, src, src_len, want, &p->page_buf))
				return -1;
			plain = p->page_buf;
			plain_len = want;
		}
		if (h.type == PAGE_DICTIONARY) {
			/* the dictionary outlives this page: keep its bytes */
			if (plain != p->page_buf) {
				free(p->dict_buf);
				p->dict_buf = NULL;
			} else {
				free(p->dict_buf);
				p->dict_buf = p->page_buf;
				p->page_buf = NULL;
			}
			if (read_dictionary(p, plain, plain_len, (uint32_t)h.num, h.enc))
				return -1;
			continue;
		}
		if ((int64_t)h.num > p->values_left)
			return page_error(p, "a page holds more values than its chunk");
		int rc;
		if (h.type == PAGE_DATA_V2) {
			rc = data_values(p, (uint32_t)h.num, h.enc, body, head, plain, plain_len);
		} else if (p->max_def) { /* v1: the levels' length, then the levels, in the body */
			if (h.def_enc != ENC_RLE)
				return error("'%s': column '%s' has definition levels encoded %s, which "
					     "is not supported (RLE is)", p->name, p->column,
					     encoding_name(h.def_enc));
			if (plain_len < 4 || get_le32(plain) > plain_len - 4)
				return page_error(p, "its definition levels run past the page");
			size_t dl = get_le32(plain);
			rc = data_values(p, (uint32_t)h.num, h.enc, plain + 4, dl, plain + 4 + dl,
					 plain_len - 4 - dl);
		} else {
			rc = data_values(p, (uint32_t)h.num, h.enc, NULL, 0, plain, plain_len);
		}
		if (rc)
			return -1;
		p->values_left -= h.num;
		if (h.num)
			return 1;
	}
	return 0;
}

/* ---- the column, row by row ---- */

static void start_chunk(struct parquet *p)
{
	const struct chunk *c = &p->chunks[p->ci];
	p->pos = c->start;
	p->chunk_end = c->start + c->size;
	p->values_left = c->values;
	p->has_dict = 0;
	p->dict_len = 0;
	p->page_len = p->page_next = 0;
}

int parquet_next(struct parquet *p, const uint8_t **s, size_t *n)
{
	if (p->failed)
		return -1;
	while (p->page_next >= p->page_len) {
		if (p->ci >= p->n_chunks)
			return 0;
		int r = next_page(p);
		if (r < 0) {
			p->failed = 1;
			return -1;
		}
		if (r == 0 && ++p->ci < p->n_chunks)
			start_chunk(p);
	}
	uint32_t i = p->page_next++;
	*s = p->val_s[i];
	*n = p->val_n[i];
	if (!*s) {
		*s = (const uint8_t *)"";
		return 2;
	}
	if (p->prefixed) { /* the previous string's first val_pre bytes, then the suffix */
		p->cur.len = p->val_pre[i]; /* checked: at most the previous string */
		buf_append(&p->cur, *s, *n);
		*s = p->cur.data;
		*n = p->cur.len;
	}
	return 1;
}

int parquet_open_mem(struct parquet **pp, const uint8_t *data, size_t len, const char *name,
		     const char *column)
{
	struct parquet *p = xcalloc(1, sizeof(*p));
	p->name = p->name_copy = xstrdup(name);
	p->data = data;
	p->len = len;
	p->column = column;
	*pp = p;
	if (read_footer(p)) {
		parquet_close(p);
		*pp = NULL;
		return -1;
	}
	if (p->n_chunks)
		start_chunk(p);
	return 0;
}

int parquet_open(struct parquet **pp, const char *path, const char *column)
{
	*pp = NULL;
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return error("cannot open '%s': %s", path, strerror(errno));
	struct stat st;
	if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
		close(fd);
		return error("'%s': a Parquet file must be a regular file (its footer is read "
			     "first)", path);
	}
	size_t len = (size_t)st.st_size;
	void *map = len ? mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
	close(fd);
	if (len && map == MAP_FAILED)
		return error("cannot map '%s': %s", path, strerror(errno));
	if (parquet_open_mem(pp, map, len, path, column)) {
		if (len)
			munmap(map, len);
		return -1;
	}
	(*pp)->map = map;
	return 0;
}

uint64_t parquet_rows(const struct parquet *p) { return p->rows; }
uint64_t parquet_file_bytes(const struct parquet *p) { return p->len; }

void parquet_close(struct parquet *p)
{
	if (!p)
		return;
	if (p->map)
		munmap(p->map, p->len);
	free(p->chunks);
	free(p->dict_buf);
	free(p->dict_s);
	free(p->dict_n);
	free(p->page_buf);
	free(p->val_pre);
	buf_free(&p->cur);
	free(p->val_s);
	free(p->val_n);
	free(p->name_copy);
	free(p);
}
