/* snappy.c - raw Snappy blocks (snappy.h). */
#include "snappy.h"

#include <string.h>

/* A varint of at most 32 bits at *p: 0, or -1. */
static int varint32(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
	*v = 0;
	for (int shift = 0; shift < 35; shift += 7) {
		if (*p >= end)
			return -1;
		uint8_t b = *(*p)++;
		*v |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80))
			return *v <= 0xffffffffu ? 0 : -1;
	}
	return -1;
}

int snappy_length(const uint8_t *in, size_t in_len, size_t *n)
{
	uint64_t v;
	if (varint32(&in, in + in_len, &v))
		return -1;
	*n = (size_t)v;
	return 0;
}

int snappy_uncompress(const uint8_t *in, size_t in_len, uint8_t *out, size_t out_len)
{
	const uint8_t *p = in, *end = in + in_len;
	uint64_t declared;
	if (varint32(&p, end, &declared) || declared != out_len)
		return -1;
	size_t o = 0;
	while (p < end) {
		uint8_t tag = *p++;
		size_t len, off;
		switch (tag & 3) {
		case 0: /* literal: length-1 in the tag, or in 1-4 bytes after it */
			len = tag >> 2;
			if (len >= 60) {
				size_t k = len - 59;
				if ((size_t)(end - p) < k)
					return -1;
				len = 0;
				for (size_t i = 0; i < k; i++)
					len |= (size_t)p[i] << (8 * i);
				p += k;
			}
			len += 1;
			if ((size_t)(end - p) < len || out_len - o < len)
				return -1;
			memcpy(out + o, p, len);
			p += len;
			o += len;
			continue;
		case 1: /* copy: length 4-11, an 11-bit offset */
			if (p >= end)
				return -1;
			len = ((tag >> 2) & 7) + 4;
			off = ((size_t)(tag >> 5) << 8) | *p++;
			break;
		case 2: /* copy: length 1-64, a 16-bit offset */
			if (end - p < 2)
				return -1;
			len = (size_t)(tag >> 2) + 1;
			off = (size_t)p[0] | (size_t)p[1] << 8;
			p += 2;
			break;
		default: /* copy: length 1-64, a 32-bit offset */
			if (end - p < 4)
				return -1;
			len = (size_t)(tag >> 2) + 1;
			off = (size_t)p[0] | (size_t)p[1] << 8 | (size_t)p[2] << 16 | (size_t)p[3] << 24;
			p += 4;
			break;
		}
		if (off == 0 || off > o || out_len - o < len)
			return -1;
		/* byte by byte: a copy may overlap what it writes (off < len repeats) */
		for (size_t i = 0; i < len; i++)
			out[o + i] = out[o - off + i];
		o += len;
	}
	return o == out_len ? 0 : -1;
}
