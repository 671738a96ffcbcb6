#!/usr/bin/env bash
# docs_sync.sh - the documentation cannot drift from the program.
#
# For every command in 'asyncpp help':
#   - 'asyncpp CMD -h' exits 0 and prints its usage on stdout, or says "not
#     implemented yet" and exits 1 (then the command is skipped);
#   - man/asyncpp-CMD.1 exists, its SYNOPSIS (between .nf and .fi) equals the
#     usage lines of -h ("usage: " and "   or: " removed), and it mentions
#     every long option that -h prints;
#   - 'asyncpp help CMD' prints the man page (compiled in): its NAME line,
#     and no roff left over (requests, font or character escapes);
#   - asyncpp(1) lists the command.
# For the configuration:
#   - every key of io/config/config_keys.h is documented in man/asyncpp.ini.5 under
#     its [section], with its type and default, and nothing else is;
#   - 'asyncpp train --print-config' (when train implements it) prints exactly
#     the keys of the table.
# Prints one PASS/FAIL/SKIP line per check.
set -u
. "$ROOT/tests/lib.sh"
MAN=$ROOT/man

# Undo the roff escapes used in synopses and key lists.
unroff() {
	sed -e 's/\\-/-/g' -e 's/\\(em/--/g' -e 's/\\&//g' -e 's/\\f[BIRP]//g' \
		-e 's/\\(\*l/lambda/g' -e 's/\\e/\\/g'
}

# The SYNOPSIS of a man page: lines inside .nf/.fi between .SH SYNOPSIS and
# the next .SH, roff requests dropped.
man_synopsis() {
	awk '/^\.SH/ { insyn = ($0 ~ /^\.SH "?SYNOPSIS"?$/); next }
	     insyn && /^\.nf/ { nf = 1; next }
	     insyn && /^\.fi/ { nf = 0; next }
	     insyn && nf && !/^\./ { print }' "$1" | unroff
}

# The usage lines of -h output, prefixes removed.
help_usage() {
	sed -n -e 's/^usage: //p' -e 's/^   or: //p'
}

if ! "$ASYNCPP" help > help.txt 2> help.err; then
	fail "help" "'asyncpp help' failed: $(head -c 200 help.err)"
	exit 0
fi
commands=$(awk '/^commands:/ { on = 1; next } on && /^$/ { exit } on && NF { print $1 }' help.txt)
if [ -z "$commands" ]; then
	fail "help" "no commands found in 'asyncpp help'"
	exit 0
fi
pass "help lists $(echo $commands | wc -w) commands"

page1=$MAN/asyncpp.1
for cmd in $commands; do
	# asyncpp(1) lists every command under COMMANDS.
	if [ -f "$page1" ] && unroff < "$page1" | grep -qx "\.B $cmd"; then
		pass "asyncpp.1 lists $cmd"
	else
		fail "asyncpp.1 lists $cmd" "no '.B $cmd' entry in man/asyncpp.1"
	fi

	"$ASYNCPP" "$cmd" -h > h.out 2> h.err
	rc=$?
	if [ "$rc" -eq 1 ] && grep -q "not implemented yet" h.err; then
		skip "$cmd synopsis" "'$cmd' is not implemented yet"
		continue
	fi
	if [ "$rc" -ne 0 ]; then
		fail "$cmd -h" "exit $rc, expected 0: $(head -c 200 h.err)"
		continue
	fi
	if [ -s h.err ]; then
		fail "$cmd -h" "wrote to stderr: $(head -c 200 h.err)"
	else
		pass "$cmd -h"
	fi

	"$ASYNCPP" help "$cmd" > help_cmd.out 2>&1
	leftover=$(grep -nE '^ *\.[A-Z][A-Za-z]?( |$)|\\f[BIRP]|\\\(|\\-' help_cmd.out | head -n 3)
	if grep -q "^       asyncpp-$cmd - " help_cmd.out && [ -z "$leftover" ] &&
	   [ "$(wc -l < help_cmd.out)" -gt 20 ]; then
		pass "help $cmd shows the man page"
	else
		fail "help $cmd shows the man page" "$(head -n 3 help_cmd.out | tr '\n' ' ') $leftover"
	fi

	page=$MAN/asyncpp-$cmd.1
	if [ ! -f "$page" ]; then
		fail "$cmd man page" "man/asyncpp-$cmd.1 is missing"
		continue
	fi
	pass "$cmd man page"

	help_usage < h.out > want.txt
	man_synopsis "$page" > got.txt
	if [ ! -s want.txt ]; then
		fail "$cmd synopsis" "-h prints no 'usage: ' line"
	elif cmp -s want.txt got.txt; then
		pass "$cmd synopsis"
	else
		fail "$cmd synopsis" "man page SYNOPSIS differs from -h: $(diff want.txt got.txt | grep '^[<>]' | head -n 4 | tr '\n' ' ')"
	fi

	unroff < "$page" > page.txt
	missing=""
	for o in $(grep -o -- '--[a-z][a-z0-9-]*' h.out | sort -u); do
		grep -q -e "$o\([^a-z0-9-]\|$\)" page.txt || missing="$missing $o"
	done
	if [ -z "$missing" ]; then
		pass "$cmd options documented"
	else
		fail "$cmd options documented" "not in man/asyncpp-$cmd.1:$missing"
	fi
done

# ---- every page through the built-in renderer (a pipe: no man) ----
# no roff left over: requests, font and special-character escapes, thin
# spaces, a doubled backslash ending a shell line, a tbl format line;
# tables come out in columns
for page in "$MAN"/*.[157]; do
	topic=$(basename "$page" | sed 's/\.[157]$//')
	"$ASYNCPP" help "$topic" > render.out 2>&1
	leftover=$(grep -nE '^ *\.[A-Z][A-Za-z]?( |$)|\\f[BIRP]|\\\(|\\-|\\\||\\\\$|^ *[lcrn]( +[lcrn])*\.$' \
		render.out | head -n 3)
	if [ -z "$leftover" ] && [ "$(wc -l < render.out)" -gt 20 ]; then
		pass "help $topic renders"
	else
		fail "help $topic renders" "$leftover"
	fi
done
"$ASYNCPP" help formats > render.out 2>&1
if grep -qE '^ +offset  size  field$' render.out &&
   grep -qE '^ +28\+H    4     crc32c of bytes 8 to 28\+H' render.out; then
	pass "help formats: tables in columns"
else
	fail "help formats: tables in columns" "$(grep -m2 -A2 'offset' render.out | tr '\n' '|')"
fi

# ---- configuration keys ----
keys_h=$ROOT/io/config/config_keys.h
ini5=$MAN/asyncpp.ini.5
# "section key type default" (tab-separated) from the X-macro table.
sed -n 's/^[[:space:]]*X(\([a-z0-9_]*\), *\([a-z0-9_]*\), *\(INT_IN([^)]*)\|FLOAT_IN([^)]*)\|STR\|CHOICE("[^"]*")\), *"\([^"]*\)",.*/\1\t\2\t\3\t\4/p' \
	"$keys_h" > table.tsv
n_keys=$(wc -l < table.tsv)
n_decl=$(grep -c '^[[:space:]]*X(' "$keys_h")
if [ "$n_keys" -gt 0 ] && [ "$n_keys" -eq "$n_decl" ]; then
	pass "config_keys.h parsed ($n_keys keys)"
else
	fail "config_keys.h parsed" "read $n_keys of $n_decl X(...) lines"
fi

# What the man page should say for each key: "section key (type; default D)".
awk -F'\t' '{
	t = $3
	if (t ~ /^(INT|FLOAT)_IN\(/) {
		# INT_IN(lo, hi) -> "int, lo..hi" (or "int, lo or more")
		kind = (t ~ /^INT/) ? "int" : "float"
		sub(/^[A-Z]+_IN\(/, "", t); sub(/\)$/, "", t)
		split(t, r, /, */)
		f = (kind == "int") ? "%d" : "%g"
		t = kind ", " (r[2] == "INFINITY" ? sprintf(f " or more", r[1]) : sprintf(f ".." f, r[1], r[2]))
	} else if (t == "STR") t = "string";
	else { sub(/^CHOICE\("/, "", t); sub(/"\)$/, "", t); gsub(/\|/, ", ", t); t = "one of " t }
	d = $4 == "" ? "empty" : $4
	printf "%s %s (%s; default %s)\n", $1, $2, t, d
}' table.tsv | sort > keys_want.txt

# What it does say: ".SS [section]" headings, then ".TP", ".B key", a line.
unroff < "$ini5" | awk '
	/^\.SH/ { sec = ""; next }
	/^\.SS \[[a-z0-9_]+\]$/ { sec = substr($2, 2, length($2) - 2); next }
	sec != "" && /^\.TP/ { tp = 1; next }
	tp && /^\.B [a-z0-9_]+$/ { key = $2; tp = 0; want = 1; next }
	want { printf "%s %s %s\n", sec, key, $0; want = 0; next }
	{ tp = 0 }' | sort > keys_got.txt

undocumented=$(join -v1 <(cut -d' ' -f1,2 keys_want.txt | tr ' ' .) <(cut -d' ' -f1,2 keys_got.txt | tr ' ' .) | tr '\n' ' ')
stale=$(join -v2 <(cut -d' ' -f1,2 keys_want.txt | tr ' ' . | sort) <(cut -d' ' -f1,2 keys_got.txt | tr ' ' . | sort) | tr '\n' ' ')
if [ -z "$undocumented" ]; then
	pass "every config key is in asyncpp.ini.5"
else
	fail "every config key is in asyncpp.ini.5" "missing: $undocumented"
fi
if [ -z "$stale" ]; then
	pass "asyncpp.ini.5 documents no unknown key"
else
	fail "asyncpp.ini.5 documents no unknown key" "not in config_keys.h: $stale"
fi
wrong=$(comm -23 keys_want.txt keys_got.txt | head -n 3 | tr '\n' ';')
if [ -z "$wrong" ]; then
	pass "asyncpp.ini.5 types and defaults match the table"
else
	fail "asyncpp.ini.5 types and defaults match the table" "expected: $wrong"
fi

# --print-config prints exactly the table's keys, in sections.
if "$ASYNCPP" train --print-config > printed.ini 2> printed.err; then
	awk '/^\[[a-z0-9_]+\]$/ { sec = substr($0, 2, length($0) - 2); next }
	     /^[a-z0-9_]+ =/ { print sec "." $1 }' printed.ini | sort > printed_keys.txt
	cut -f1,2 table.tsv | tr '\t' . | sort > table_keys.txt
	if cmp -s printed_keys.txt table_keys.txt; then
		pass "train --print-config prints every key"
	else
		fail "train --print-config prints every key" "$(diff table_keys.txt printed_keys.txt | grep '^[<>]' | head -n 4 | tr '\n' ' ')"
	fi
else
	skip "train --print-config prints every key" "train --print-config failed: $(head -c 100 printed.err)"
fi
