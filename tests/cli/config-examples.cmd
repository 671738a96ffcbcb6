for f in "$TESTDATA"/*.ini; do $ASYNCPP train -c "$f" --print-config > /dev/null || exit 1; echo "${f##*/}"; done
