$ASYNCPP bench schedule --kind 1f1b --stages 4 --micro 8 --svg s.svg --no-timeline > /dev/null && head -c 4 s.svg && echo && tail -n 1 s.svg
