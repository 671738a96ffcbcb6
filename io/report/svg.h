/* svg.h - a few helpers for writing SVG documents into a buffer.
 *
 * The document is built in memory (struct buf from util.h) and written in
 * one go, atomically to a file or to standard output, so a failed command
 * never leaves half a picture behind.
 */
#ifndef ASYNCPP_SVG_H
#define ASYNCPP_SVG_H

#include "../util.h"

/* printf into the buffer (dies on out-of-memory like every x* helper). */
void svg_printf(struct buf *b, const char *fmt, ...) PRINTF_LIKE(2, 3);
/* Append text escaped for XML character data and attribute values: & < > "
 * ' become entities, control characters and bytes of invalid UTF-8 become
 * '?', so any input gives a well-formed document. */
void svg_text(struct buf *b, const char *s);
/* Write the buffer to PATH atomically, or to stdout when PATH is NULL or
 * "-". Returns 0, or -1 after error() naming the file. */
int svg_save(const struct buf *b, const char *path);

#endif
