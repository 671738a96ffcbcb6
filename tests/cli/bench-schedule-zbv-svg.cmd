$ASYNCPP bench schedule --kind zb-v --stages 2 --micro 4 --svg v.svg > out && tail -n 4 out && grep -c "BACKWARD_WEIGHT mb [0-9]* chunk 1" v.svg && grep -o "weight gradient (W)" v.svg
