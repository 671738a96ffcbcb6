printf 'step,loss\n1,2.5\n2,x\n' > m.csv && $ASYNCPP plot -o p.svg m.csv; rc=$?; ls | grep -c svg; exit $rc
