printf 'step,loss\n1,3\n' > m.csv && echo keep > p.svg && $ASYNCPP plot -o p.svg m.csv; rc=$?; cat p.svg; $ASYNCPP plot --force -o p.svg m.csv && grep -c '<svg' p.svg; exit $rc
