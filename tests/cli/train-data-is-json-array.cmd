# A JSON array given as data.train is named as such, with the conversion to JSON Lines (encode refuses an array too)
printf '[{"text": "In the beginning"}]\n' > kjv.json && ( $ASYNCPP train -q --set model.n_layer=1 --set model.d_model=32 --set train.steps=2 --set data.train=kjv.json --set train.out_dir=o ) 2> err.txt; rc=$?; sed "s|$PWD/||g" err.txt >&2; exit $rc
