# tests/lib.sh - helpers for tests/scripts/*.sh (source it).
#   pass NAME; fail NAME WHY; skip NAME WHY
#   expect_exit CODE NAME -- CMD...   run CMD, pass if it exits CODE
# ASYNCPP, ROOT and TESTDATA come from tests/run.
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }
skip() { echo "SKIP $1: $2"; }
expect_exit() {
	local want=$1 name=$2; shift 3
	"$@" > out.txt 2> err.txt
	local rc=$?
	if [ "$rc" -eq "$want" ]; then pass "$name"; else
		fail "$name" "exit $rc, expected $want: $(head -c 300 err.txt)"; fi
}
