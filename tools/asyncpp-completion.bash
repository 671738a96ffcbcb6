# asyncpp-completion.bash - bash completion for asyncpp (make install puts
# it in share/bash-completion/completions/asyncpp; or source it). Nothing
# is listed here: the commands come from `asyncpp help`, the options from
# `asyncpp COMMAND -h` (so do its subcommands) and the configuration keys from `asyncpp train
# --print-config`, the tables the help itself is printed from, so the
# completion cannot drift from the program.

# the words of WHAT (commands, options, keys) for the asyncpp at $1
_asyncpp_words() {
	local prog=$1 what=$2
	shift 2
	case $what in
	commands)
		"$prog" help 2> /dev/null | awk '/^commands:/ { f = 1; next } f && /^    [a-z]/ { print $1 } f && /^$/ { exit }'
		;;
	options)
		"$prog" "$@" -h 2>&1 | grep -oE -- '(^|[ ,])--?[a-zA-Z][a-zA-Z0-9-]*' | tr -d ' ,' | sort -u
		;;
	subcommands) # of command $1: the word after it on each usage line, or
		# the list under "usage: asyncpp CMD WHAT"
		"$prog" "$1" -h 2>&1 | awk -v c="$1" '
			($1 == "usage:" || $1 == "or:") && $3 == c && $4 ~ /^[a-z]/ { print $4 }
			list && /^    [a-z][a-z0-9-]* / { print $1 }
			($1 == "usage:" || $1 == "or:") && $3 == c && $4 == "WHAT" { list = 1 }' | sort -u
		;;
	keys)
		"$prog" train --print-config 2> /dev/null |
			awk '/^\[/ { s = substr($0, 2, length($0) - 2); next } /^[a-z]/ { print s "." $1 "=" }'
		;;
	esac
}

_asyncpp() {
	local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
	local prog=${COMP_WORDS[0]}
	if [ "$COMP_CWORD" -eq 1 ]; then
		COMPREPLY=($(compgen -W "$(_asyncpp_words "$prog" commands) help --version" -- "$cur"))
		return
	fi
	local cmd=${COMP_WORDS[1]} sub=()
	case $cmd in
	help)
		[ "$COMP_CWORD" -eq 2 ] &&
			COMPREPLY=($(compgen -W "$(_asyncpp_words "$prog" commands) asyncpp ini formats distributed" -- "$cur"))
		return
		;;
	bench | tokenize)
		if [ "$COMP_CWORD" -eq 2 ]; then
			COMPREPLY=($(compgen -W "$(_asyncpp_words "$prog" subcommands "$cmd")" -- "$cur"))
			return
		fi
		[ "$cmd" = bench ] && sub=("${COMP_WORDS[2]}")
		;;
	esac
	if [ "$prev" = --set ] || [ "$prev" = -s ]; then
		COMPREPLY=($(compgen -W "$(_asyncpp_words "$prog" keys)" -- "$cur"))
		compopt -o nospace 2> /dev/null
		return
	fi
	if [[ $cur == -* ]]; then
		COMPREPLY=($(compgen -W "$(_asyncpp_words "$prog" options "$cmd" "${sub[@]}")" -- "$cur"))
		return
	fi
	COMPREPLY=($(compgen -f -- "$cur"))
}
complete -o filenames -F _asyncpp asyncpp ./asyncpp
