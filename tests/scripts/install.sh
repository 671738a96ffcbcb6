#!/usr/bin/env bash
# install.sh - 'make install PREFIX=...' puts the binary and every man page
# in place, and every page renders without a warning.
set -u
. "$ROOT/tests/lib.sh"
p=$PWD/prefix
if [ ! -x "$ROOT/asyncpp" ]; then
	skip "make install" "no ./asyncpp built (make install copies it; it does not build it here)"
	exit 0
fi
# -o asyncpp: copy the binary that exists, never rebuild it from a test.
if make -s -C "$ROOT" -o asyncpp install PREFIX="$p" > make.out 2>&1; then
	pass "make install"
else
	fail "make install" "$(tail -n 3 make.out | tr '\n' ' ')"
	exit 0
fi

if [ -x "$p/bin/asyncpp" ] && "$p/bin/asyncpp" --version > version.txt 2>&1 &&
	grep -q '^asyncpp ' version.txt; then
	pass "installed binary runs"
else
	fail "installed binary runs" "$p/bin/asyncpp: $(head -c 200 version.txt 2>/dev/null)"
fi

for src in "$ROOT"/man/*.[157]; do
	name=$(basename "$src")
	dst=$p/share/man/man${name##*.}/$name
	if cmp -s "$src" "$dst"; then pass "installed $name"; else fail "installed $name" "$dst missing or different"; fi
done
if cmp -s "$ROOT/tools/asyncpp-completion.bash" "$p/share/bash-completion/completions/asyncpp"; then
	pass "installed bash completion"
else
	fail "installed bash completion" "$p/share/bash-completion/completions/asyncpp missing or different"
fi
for must in man1/asyncpp.1 man5/asyncpp.ini.5 man5/asyncpp-formats.5; do
	[ -f "$p/share/man/$must" ] || fail "installed $must" "missing"
done

# Render each page: man-db's --warnings (groff -ww) where there is man, else
# groff itself. Any warning on stderr fails the page.
if command -v man > /dev/null 2>&1 && man --help 2>&1 | grep -q -- --warnings; then
	render() { MANWIDTH=80 man --warnings -l "$1" 2>&1 > /dev/null; }
	tool=man
elif command -v groff > /dev/null 2>&1; then
	render() { groff -man -ww -z "$1" 2>&1; }
	tool=groff
else
	skip "man pages render" "neither man nor groff is installed"
	exit 0
fi
for page in "$p"/share/man/man*/*; do
	name=$(basename "$page")
	warnings=$(render "$page")
	if [ $? -eq 0 ] && [ -z "$warnings" ]; then
		pass "$name renders ($tool)"
	else
		fail "$name renders ($tool)" "$(echo "$warnings" | head -n 3 | tr '\n' ' ')"
	fi
done

# man finds the installed pages by name.
if [ "$tool" = man ]; then
	if man -M "$p/share/man" -w asyncpp.ini > where.txt 2>&1 && grep -q 'asyncpp.ini.5' where.txt; then
		pass "man -M PREFIX/share/man finds asyncpp.ini(5)"
	else
		fail "man -M PREFIX/share/man finds asyncpp.ini(5)" "$(head -c 200 where.txt)"
	fi
fi
