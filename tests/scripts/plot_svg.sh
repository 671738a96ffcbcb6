#!/usr/bin/env bash
# plot_svg.sh - asyncpp plot: the SVG is well formed and holds one <path> per
# run; labels, skipped rows, smoothing and log scales do what they say; bad
# input fails with the file (and line) named and leaves no output behind.
. "$ROOT/tests/lib.sh"
A=$ASYNCPP

if ! command -v python3 > /dev/null; then
	skip plot "python3 is needed to parse the SVG"
	exit 0
fi

# Three runs: two CSV (one with eval rows and noise), one JSON lines.
mkdir -p a b c
awk 'BEGIN {
	print "step,tokens,wall_s,loss,val_loss,lr,grad_norm,tokens_per_s,mfu,bubble"
	for (s = 1; s <= 40; s++) {
		printf "%d,%d,%.2f,%.6f,,0.001,1.0,,,\n", s, s * 256, s * 0.5, 4 + 2 / s + ((s % 2) ? 0.3 : -0.3)
		if (s % 10 == 0) printf "%d,%d,%.2f,,%.6f,,,,,\n", s, s * 256, s * 0.5, 4.5 + 1 / s
	}
}' > a/metrics.csv
awk 'BEGIN {
	print "step,tokens,wall_s,loss,val_loss,lr,grad_norm,tokens_per_s,mfu,bubble"
	for (s = 1; s <= 30; s++) printf "%d,%d,%.2f,%.6f,,,,,,\n", s, s * 256, s * 0.4, 5 + 1 / s
	for (s = 21; s <= 40; s++) printf "%d,%d,%.2f,%.6f,,,,,,\n", s, s * 256, (s - 20) * 0.4, 4.9 + 1 / s
}' > b/metrics.csv
awk 'BEGIN { for (s = 1; s <= 40; s++) printf "{\"step\": %d, \"tokens\": %d, \"wall_s\": %.2f, \"loss\": %.6f}\n", s, s * 256, s * 0.3, 6 - s * 0.01 }' > c/metrics.jsonl
# y = 1, 10, 100 at x = 1, 10, 100: even steps on log scales
mkdir -p g
printf 'step,tokens,wall_s,loss\n1,1,1,1\n10,10,10,10\n100,100,100,100\n' > g/metrics.csv

# check.py SVG KIND [ARGS]: parse the SVG and check one property
cat > check.py <<'EOF'
import re, sys, xml.etree.ElementTree as ET
NS = '{http://www.w3.org/2000/svg}'
svg, kind, args = sys.argv[1], sys.argv[2], sys.argv[3:]
root = ET.parse(svg).getroot()
assert root.tag == NS + 'svg', 'root is not <svg>'
paths = root.findall('.//' + NS + 'path')
def points(p):
    return [(float(x), float(y)) for x, y in re.findall(r'[ML]\s*(-?[\d.]+),(-?[\d.]+)', p.get('d'))]
def texts(cls):
    g = [e for e in root.iter(NS + 'g') if e.get('class') == cls][0]
    return [t.text for t in g.iter(NS + 'text')]
if kind == 'paths':       # exactly N paths, each with points
    assert len(paths) == int(args[0]), '%d paths, expected %s' % (len(paths), args[0])
    assert all(points(p) for p in paths), 'an empty path'
elif kind == 'labels':    # the legend, in order
    got = texts('legend')
    assert got == args, 'legend %r, expected %r' % (got, args)
elif kind == 'npoints':   # path I has N points
    got = len(points(paths[int(args[0])]))
    assert got == int(args[1]), 'path %s has %d points, expected %s' % (args[0], got, args[1])
elif kind == 'even':      # path 0's three points are evenly spaced along AXIS (x or y)
    ax = 0 if args[0] == 'x' else 1
    v = [p[ax] for p in points(paths[0])]
    d1, d2 = v[1] - v[0], v[2] - v[1]
    ok = abs(d1 - d2) < 0.05 * abs(d1)
    assert ok == (args[1] == 'yes'), 'spacing %.2f %.2f' % (d1, d2)
elif kind == 'ticks':     # the tick labels of an axis include the given ones
    got = texts(args[0] + '-labels')
    assert all(t in got for t in args[1:]), 'ticks %r lack some of %r' % (got, args[1:])
elif kind == 'centred':   # path 0 is one point in the middle of the frame
    f = [e for e in root.iter(NS + 'rect') if e.get('class') == 'frame'][0]
    cx = float(f.get('x')) + float(f.get('width')) / 2
    cy = float(f.get('y')) + float(f.get('height')) / 2
    pts = points(paths[0])
    assert len(pts) == 1, '%d points' % len(pts)
    assert abs(pts[0][0] - cx) < 0.5 and abs(pts[0][1] - cy) < 0.5, 'at %r, centre %r' % (pts[0], (cx, cy))
elif kind == 'finite':    # every coordinate and tick position is a finite number in the canvas
    w, h = float(root.get('width')), float(root.get('height'))
    pts = [pt for p in paths for pt in points(p)]
    pos = [float(e.get(k)) for e in root.iter() for k in ('x1', 'y1', 'x2', 'y2', 'x', 'y') if e.get(k)]
    bad = [v for v in pos + [c for pt in pts for c in pt] if not (-1 <= v <= max(w, h) + 1)]
    text = open(svg).read().lower()
    assert 'nan' not in text and 'inf' not in text, 'nan or inf in the SVG'
    assert len(pts) == int(args[0]) and not bad, '%d points, out of the canvas: %r' % (len(pts), bad[:5])
elif kind == 'margin':    # the lowest point of every path sits above the frame's bottom edge
    f = [e for e in root.iter(NS + 'rect') if e.get('class') == 'frame'][0]
    bottom = float(f.get('y')) + float(f.get('height'))
    low = max(y for p in paths for _, y in points(p))
    assert low < bottom - 2, 'lowest point at y=%.1f, frame bottom %.1f' % (low, bottom)
elif kind == 'title':
    assert root.find(NS + 'title').text == args[0], 'title %r' % root.find(NS + 'title').text
print('ok')
EOF
check() { # NAME SVG KIND ARGS...
	local name=$1; shift
	if python3 check.py "$@" > check.out 2>&1; then pass "$name"; else
		fail "$name" "$(tail -n 1 check.out)"; fi
}

# 1. well formed, one path per run, labels from directories, CSV and JSONL
if $A plot -o all.svg a/metrics.csv b/metrics.csv c/metrics.jsonl 2> err.txt; then
	check one_path_per_run all.svg paths 3
	check default_labels all.svg labels a b c
	check default_title all.svg title "train loss against step"
else
	fail one_path_per_run "plot failed: $(cat err.txt)"
fi

# 2. labels given (escaped for XML), title, standard output
if $A plot --label 'x<&>"y' --label 'é' --title 'T & t' a/metrics.csv b/metrics.csv c/metrics.jsonl > out.svg 2> err.txt; then
	check given_labels_escaped out.svg labels 'x<&>"y' 'é' c
	check title_escaped out.svg title 'T & t'
else
	fail given_labels_escaped "plot failed: $(cat err.txt)"
fi

# 3. --y val_loss keeps only the evaluation rows; loss keeps only the training rows
$A plot -o val.svg --y val_loss a/metrics.csv 2> err.txt && check val_loss_rows_only val.svg npoints 0 4
$A plot -o loss.svg a/metrics.csv 2> err.txt && check loss_rows_only loss.svg npoints 0 40
# several --y: one line per file and column, all of them drawn (issue 31:
# the last --y alone was drawn), named by the column (and the file's label)
if $A plot -o two_y.svg --y loss --y val_loss a/metrics.csv 2> err.txt; then
	check several_y_one_path_each two_y.svg paths 2
	check several_y_labels two_y.svg labels loss val_loss
	check several_y_points two_y.svg npoints 1 4
	check several_y_title two_y.svg title "train loss and val loss against step"
else
	fail several_y_one_path_each "plot failed: $(cat err.txt)"
fi
if $A plot -o two_y_two.svg --y loss --y lr a/metrics.csv c/metrics.jsonl 2> err.txt; then
	fail several_y_every_file_has_each "c has no lr column, yet the plot succeeded"
elif grep -q "c/metrics.jsonl': no rows with a 'lr' value" err.txt && [ ! -e two_y_two.svg ]; then
	pass several_y_every_file_has_each
else
	fail several_y_every_file_has_each "$(cat err.txt)"
fi
if $A plot -o two_y_ab.svg --y loss --y lr a/metrics.csv a/metrics.csv 2> err.txt; then
	check several_y_files_labels two_y_ab.svg labels "a loss" "a lr" "a loss" "a lr"
else
	fail several_y_files_labels "plot failed: $(cat err.txt)"
fi

# 4. a resumed run (steps 21-30 logged twice) draws each step once
$A plot -o resumed.svg b/metrics.csv 2> err.txt && check resume_replaces_steps resumed.svg npoints 0 40
# wall_s restarts at 0 on resume: it continues instead, every row kept
$A plot -o resumed_wall.svg --x wall_s b/metrics.csv 2> err.txt &&
	check resume_wall_time_continues resumed_wall.svg npoints 0 50

# 5. smoothing keeps the points and damps the zig-zag of run a
$A plot -o raw.svg a/metrics.csv && $A plot -o smooth.svg --smooth 0.8 a/metrics.csv
cat > tv.py <<'EOF'
import re, sys, xml.etree.ElementTree as ET
NS = '{http://www.w3.org/2000/svg}'
def ys(f):
    d = ET.parse(f).getroot().find('.//' + NS + 'path').get('d')
    return [float(y) for y in re.findall(r',(-?[\d.]+)', d)]
raw, sm = ys(sys.argv[1]), ys(sys.argv[2])
tv = lambda v: sum(abs(b - a) for a, b in zip(v, v[1:]))
assert len(raw) == len(sm), 'point counts differ'
assert tv(sm) < 0.5 * tv(raw), 'total variation %.1f vs %.1f' % (tv(sm), tv(raw))
print('ok')
EOF
if python3 tv.py raw.svg smooth.svg > tv.out 2>&1; then pass smoothing_damps_noise; else
	fail smoothing_damps_noise "$(tail -n 1 tv.out)"; fi

# 6. log scales: 1, 10, 100 evenly spaced only on the log axis; decade ticks
$A plot -o lin.svg g/metrics.csv && check linear_y_uneven lin.svg even y no
$A plot -o logy.svg --logy g/metrics.csv && check logy_even logy.svg even y yes
$A plot -o logx.svg --logx g/metrics.csv && check logx_even logx.svg even x yes
check logx_decade_ticks logx.svg ticks x 1 10 100
$A plot -o tok.svg --x tokens c/metrics.jsonl && check tokens_si_ticks tok.svg ticks x 2k 4k 10k

# a single row: one point, in the middle
mkdir -p one && printf 'step,loss\n5,3\n' > one/metrics.csv
$A plot -o one.svg one/metrics.csv 2> err.txt && check single_point_centred one.svg centred

# --ymax fixes the top only: the data still get a margin at the bottom
$A plot -o ymax.svg --ymax 7 a/metrics.csv 2> err.txt && check ymax_keeps_bottom_margin ymax.svg margin

# values spanning most of the doubles still give finite coordinates and labels
mkdir -p huge && printf 'step,loss\n1,1e308\n2,-1e308\n3,1e-300\n' > huge/metrics.csv
$A plot -o huge.svg huge/metrics.csv 2> err.txt && check huge_range_finite huge.svg finite 3
mkdir -p hugelog && printf 'step,loss\n1,1e-300\n2,1e300\n' > hugelog/metrics.csv
$A plot -o hugelog.svg --logy hugelog/metrics.csv 2> err.txt &&
	check huge_log_range_finite hugelog.svg finite 2

# 7. bad input: exit 1, file (and line) named, an existing output untouched
printf 'step,loss\n1,2.5\n2,abc\n' > bad.csv
echo keep > keep.svg
expect_exit 1 bad_number_fails -- $A plot --force -o keep.svg a/metrics.csv bad.csv
if grep -q "bad.csv:3:" err.txt; then pass bad_number_names_file_line; else
	fail bad_number_names_file_line "$(cat err.txt)"; fi
if [ "$(cat keep.svg)" = keep ] && [ -z "$(ls | grep '\.tmp\.')" ]; then
	pass failure_leaves_output_untouched
else
	fail failure_leaves_output_untouched "keep.svg changed or a temp file is left"
fi
expect_exit 1 missing_file_fails -- $A plot -o x.svg nope/metrics.csv
grep -q "nope/metrics.csv" err.txt && pass missing_file_named || fail missing_file_named "$(cat err.txt)"
# with several --y, an unreadable file is said once, not once per column
expect_exit 1 missing_file_several_y_fails -- $A plot -o x.svg --y loss --y lr nope/metrics.csv
[ "$(grep -c "nope/metrics.csv" err.txt)" = 1 ] && pass missing_file_named_once ||
	fail missing_file_named_once "$(cat err.txt)"
expect_exit 1 no_y_values_fails -- $A plot -o x.svg --y val_loss b/metrics.csv
grep -q "b/metrics.csv.*val_loss" err.txt && pass no_y_values_named || fail no_y_values_named "$(cat err.txt)"
printf '{"step": 1, "loss": 2}\n{"step": 2, "loss": }\n' > bad.jsonl
expect_exit 1 bad_jsonl_fails -- $A plot bad.jsonl
grep -q "bad.jsonl:2:" err.txt && pass bad_jsonl_names_line || fail bad_jsonl_names_line "$(cat err.txt)"
expect_exit 1 unwritable_output_fails -- $A plot -o no/such/dir/x.svg a/metrics.csv
[ ! -e x.svg ] && [ ! -e no ] && pass no_output_on_bad_input || fail no_output_on_bad_input "x.svg written"

# 8. usage errors exit 2
expect_exit 2 usage_no_files -- $A plot
expect_exit 2 usage_bad_y -- $A plot --y perplexity a/metrics.csv
expect_exit 2 usage_bad_x -- $A plot --x loss a/metrics.csv
expect_exit 2 usage_bad_smooth -- $A plot --smooth 1 a/metrics.csv
expect_exit 2 usage_too_many_labels -- $A plot --label p --label q a/metrics.csv
expect_exit 2 usage_bad_ylim -- $A plot --ymin 5 --ymax 4 a/metrics.csv
expect_exit 2 usage_log_nonpositive_ylim -- $A plot --logy --ymin 0 a/metrics.csv
expect_exit 0 help_exits_0 -- $A plot -h
