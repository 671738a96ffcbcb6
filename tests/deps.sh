#!/bin/sh
# deps.sh PACKAGE... - install the Debian packages that are missing (as root),
# or print the exact command to run. Node.js and npm are checked as commands:
# a machine may have them from another source than Debian's packages.
missing=""
for p in "$@"; do
	case "$p" in
	nodejs) command -v node >/dev/null 2>&1 && continue ;;
	npm) command -v npm >/dev/null 2>&1 && continue ;;
	esac
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
		missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ]; then
	echo "deps: installing$missing"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq && apt-get install -y -qq --no-install-recommends $missing >/dev/null ||
		{ echo "deps: apt-get install$missing failed" >&2; exit 1; }
else
	echo "deps: missing packages:$missing" >&2
	echo "deps: run: sudo apt-get install -y$missing" >&2
	exit 1
fi
