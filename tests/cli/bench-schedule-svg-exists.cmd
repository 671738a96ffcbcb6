# an existing --svg file is kept without --force, and replaced with it
printf old > s.svg; $ASYNCPP bench schedule --kind gpipe --stages 2 --micro 2 --svg s.svg > /dev/null 2> err.txt; echo "exit $?"; cat s.svg; echo; grep -c -- "--force" err.txt; $ASYNCPP bench schedule --kind gpipe --stages 2 --micro 2 --svg s.svg --force | tail -n 1; head -c 4 s.svg; echo
