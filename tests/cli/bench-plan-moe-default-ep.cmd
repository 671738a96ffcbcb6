# without --ep: EP 1 and 8, or 1 alone when 8 does not divide the experts (the EP column)
$ASYNCPP bench plan --experts 4 --d-expert 512 --layers 4 --d-model 256 --stages 2 --dp 8 | awk '$1 == 2 && $3 ~ /^[0-9]+$/ {print $2}' && $ASYNCPP bench plan --experts 16 --d-expert 512 --layers 4 --d-model 256 --stages 2 --dp 8 | awk '$1 == 2 && $3 ~ /^[0-9]+$/ {print $2}'
