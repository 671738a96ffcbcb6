/* plot.c - `asyncpp plot METRICS...`: metrics files as an SVG line chart.
 *
 * Each metrics file (CSV or JSON lines, io/report/metrics.h) becomes one run: one
 * <path> of each chosen y column (--y, repeatable) against the chosen x
 * column, in the legend under its label (by default the name of the file's
 * directory, which for asyncpp train is the run's out_dir; with several
 * --y, followed by the column). Rows without a y column are skipped for
 * it, so --y val_loss draws the evaluation rows only.
 *
 * A resumed run appends to its metrics file, so x can go back: for step and
 * tokens the later rows replace the earlier ones from that x on; wall_s,
 * which restarts at 0 on resume, continues from the last value instead.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../io/report/metrics.h"
#include "../io/report/svg.h"
#include "../io/util.h"
#include "cmd.h"
#include "opts.h"

static const char *const usage[] = {
	"asyncpp plot [-o OUT.svg] [--x COL] [--y COL]... [--smooth ALPHA] [--logx] [--logy] "
	"[--ymin Y] [--ymax Y] [--title T] [--label NAME]... METRICS...",
	NULL,
};

/* The columns of io/report/metrics.h, in order, and how an axis names them. */
enum col {
	C_STEP, C_TOKENS, C_WALL, C_LOSS, C_VAL, C_LR, C_GNORM, C_TPS, C_MFU, C_BUBBLE,
	C_MOE_BALANCE, C_MOE_Z, N_COL
};
static const struct {
	const char *name, *axis;
} columns[N_COL] = {
	{"step", "step"},
	{"tokens", "tokens"},
	{"wall_s", "wall time (s)"},
	{"loss", "train loss"},
	{"val_loss", "val loss"},
	{"lr", "learning rate"},
	{"grad_norm", "gradient norm"},
	{"tokens_per_s", "tokens/s"},
	{"mfu", "MFU"},
	{"bubble", "bubble fraction"},
	{"moe_balance", "load-balancing term per layer"},
	{"moe_z", "router z-loss per layer"},
};

static int column_of(const char *name)
{
	for (int i = 0; i < N_COL; i++)
		if (!strcmp(columns[i].name, name))
			return i;
	return -1;
}

/* The value of column c in row r; 0 when the row lacks it. */
static int row_value(const struct metrics_row *r, int c, double *v)
{
	switch (c) {
	case C_STEP: *v = (double)r->step; return 1;
	case C_TOKENS: *v = r->tokens; return 1;
	case C_WALL: *v = r->wall_s; return 1;
	case C_LOSS: *v = r->loss; return r->has_loss;
	case C_VAL: *v = r->val_loss; return r->has_val_loss;
	case C_LR: *v = r->lr; return r->has_lr;
	case C_GNORM: *v = r->grad_norm; return r->has_grad_norm;
	case C_TPS: *v = r->tokens_per_s; return r->has_tps;
	case C_MFU: *v = r->mfu; return r->has_mfu;
	case C_BUBBLE: *v = r->bubble; return r->has_bubble;
	case C_MOE_BALANCE: *v = r->moe_balance; return r->has_moe;
	case C_MOE_Z: *v = r->moe_z; return r->has_moe;
	}
	return 0;
}

struct run {
	const char *path;
	char *label;
	double *x, *y;
	int n;
};

/* The default label: the name of the directory holding the file, else the
 * file's own name. */
static char *default_label(const char *path)
{
	char *s = xstrdup(path);
	size_t n = strlen(s);
	while (n > 1 && s[n - 1] == '/')
		s[--n] = 0;
	char *slash = strrchr(s, '/');
	char *label = NULL;
	if (slash) {
		*slash = 0;
		while (slash > s && slash[-1] == '/')
			*--slash = 0;
		char *dir = strrchr(s, '/');
		dir = dir ? dir + 1 : s;
		if (*dir && strcmp(dir, ".") && strcmp(dir, ".."))
			label = xstrdup(dir);
		else
			label = xstrdup(strrchr(path, '/') + 1);
	} else {
		label = xstrdup(s);
	}
	free(s);
	return label;
}

/* Read one file into r: finite (x, y) pairs, resumes folded in, log axes'
 * non-positive values dropped with a warning, then the EMA. 0, or -1 after
 * error(): 1 when the file could not be read at all (its other columns need
 * not be tried). */
static int load_run(struct run *r, int xc, int yc, int logx, int logy, double alpha)
{
	struct metrics_series s;
	if (metrics_read(r->path, &s))
		return 1;
	r->x = xmalloc(sizeof(double) * (size_t)(s.n ? s.n : 1));
	r->y = xmalloc(sizeof(double) * (size_t)(s.n ? s.n : 1));
	r->n = 0;
	int dropped = 0, with_y = 0;
	double offset = 0, last_x = 0;
	for (int i = 0; i < s.n; i++) {
		double x = 0, y = 0;
		if (!row_value(&s.rows[i], yc, &y))
			continue;
		with_y++;
		row_value(&s.rows[i], xc, &x);
		if (!isfinite(x) || !isfinite(y))
			continue;
		if (xc == C_WALL) {
			if (r->n && x + offset < last_x)
				offset = last_x;
			x += offset;
			last_x = x;
		} else {
			while (r->n && r->x[r->n - 1] >= x)
				r->n--;
		}
		if ((logx && x <= 0) || (logy && y <= 0)) {
			dropped++;
			continue;
		}
		r->x[r->n] = x;
		r->y[r->n] = y;
		r->n++;
	}
	metrics_series_free(&s);
	if (!with_y)
		return error("'%s': no rows with a '%s' value", r->path, columns[yc].name);
	if (dropped)
		warning("'%s': %d row%s with values <= 0 left out of the log scale", r->path,
			dropped, dropped == 1 ? "" : "s");
	if (!r->n)
		return error("'%s': no finite '%s' values to plot", r->path, columns[yc].name);
	/* EMA: s = alpha*s + (1-alpha)*y, started at the first value */
	if (alpha > 0) {
		double ema = r->y[0];
		for (int i = 0; i < r->n; i++) {
			ema = alpha * ema + (1 - alpha) * r->y[i];
			r->y[i] = ema;
		}
	}
	return 0;
}

/* ---- axes ---- */

struct axis {
	double lo, hi; /* data range shown */
	int log;
	double ticks[32];
	int nticks;
	double step; /* spacing of linear ticks, for their precision; 0 for log */
};

static double tr(const struct axis *a, double v)
{
	return a->log ? log10(v) : v;
}

/* hi - lo without overflow: halves first when the difference would not fit
 * in a double (an axis from -1e308 to 1e308). */
static double span(double lo, double hi)
{
	double d = hi - lo;
	return isfinite(d) ? d : 2 * (hi / 2 - lo / 2);
}

/* 1, 2 or 5 times a power of ten, near range/target. */
static double nice_step(double range, int target)
{
	double raw = isfinite(range) ? range / target : DBL_MAX / target;
	double mag = pow(10, floor(log10(raw)));
	double f = raw / mag;
	return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
}

static void linear_ticks(struct axis *a)
{
	double step = nice_step(span(a->lo, a->hi), 5);
	double first = ceil(a->lo / step - 1e-9);
	a->nticks = 0;
	a->step = step;
	for (int i = 0; a->nticks < (int)ARRAY_SIZE(a->ticks); i++) {
		double t = (first + i) * step;
		if (t > a->hi + step * 1e-9)
			break;
		if (fabs(t) < step * 1e-9)
			t = 0;
		a->ticks[a->nticks++] = t;
	}
}

static void log_ticks(struct axis *a)
{
	double llo = log10(a->lo), lhi = log10(a->hi);
	int k0 = (int)ceil(llo - 1e-9), k1 = (int)floor(lhi + 1e-9);
	a->step = 0;
	a->nticks = 0;
	if (k1 - k0 + 1 >= 3) { /* powers of ten, thinned to at most 8 */
		int every = (k1 - k0) / 8 + 1;
		for (int k = k0; k <= k1 && a->nticks < (int)ARRAY_SIZE(a->ticks); k += every)
			a->ticks[a->nticks++] = pow(10, k);
		return;
	}
	static const double mult[] = {1, 2, 5};
	for (int k = k0 - 1; k <= k1; k++)
		for (size_t m = 0; m < ARRAY_SIZE(mult); m++) {
			double t = mult[m] * pow(10, k);
			if (t >= a->lo * (1 - 1e-9) && t <= a->hi * (1 + 1e-9) &&
			    a->nticks < (int)ARRAY_SIZE(a->ticks))
				a->ticks[a->nticks++] = t;
		}
	if (a->nticks < 3 || a->nticks > 10)
		linear_ticks(a); /* a narrow range: plain ticks, placed on the log scale */
}

/* Set the range from [lo, hi] (pad_lo, pad_hi: fractions of the range added
 * below and above, in the axis's own scale; 0 where the user fixed that end)
 * and choose the ticks. */
static void axis_setup(struct axis *a, double lo, double hi, double pad_lo, double pad_hi)
{
	if (a->log) {
		double l0 = log10(lo), l1 = log10(hi);
		if (l1 - l0 < 1e-12) {
			l0 -= 0.5;
			l1 += 0.5;
		}
		/* padding stays inside the normal doubles (1e-307 .. 1e308) */
		double r = l1 - l0;
		a->lo = pow(10, fmax(l0 - r * pad_lo, fmin(l0, -307)));
		a->hi = pow(10, fmin(l1 + r * pad_hi, fmax(l1, 308)));
		log_ticks(a);
	} else {
		if (hi - lo < 1e-12 * fmax(1, fabs(hi))) {
			double d = lo ? fabs(lo) * 0.1 : 1;
			lo -= d;
			hi += d;
		}
		double half = hi / 2 - lo / 2; /* half the range: no overflow */
		a->lo = fmax(lo - half * (2 * pad_lo), -DBL_MAX);
		a->hi = fmin(hi + half * (2 * pad_hi), DBL_MAX);
		linear_ticks(a);
	}
}

/* A tick label: 1234567 -> 1.2M style for big values, enough decimals for
 * the tick spacing otherwise. */
static void tick_label(char *out, size_t n, double v, const struct axis *a)
{
	double av = fabs(v);
	static const struct {
		double div;
		const char *suffix;
	} si[] = {{1e9, "G"}, {1e6, "M"}, {1e3, "k"}};
	double top = fmax(fabs(a->lo), fabs(a->hi));
	if (v == 0) {
		snprintf(out, n, "0");
		return;
	}
	for (size_t i = 0; i < ARRAY_SIZE(si); i++) {
		if (top >= 1e4 && top < 1e12 && av >= si[i].div) {
			double step = a->step ? a->step / si[i].div : 0;
			int dec = step > 0 && step < 1 ? (int)ceil(-log10(step) - 1e-9) : 0;
			if (!a->step) /* log ticks: as many digits as the value needs */
				snprintf(out, n, "%g%s", v / si[i].div, si[i].suffix);
			else
				snprintf(out, n, "%.*f%s", dec, v / si[i].div, si[i].suffix);
			return;
		}
	}
	if (!a->step || av < 1e-3 || top >= 1e12) { /* beyond G: 1e15, 5e307 */
		snprintf(out, n, "%g", v);
		/* 1e-05 -> 1e-5 */
		char *e = strchr(out, 'e');
		if (e) {
			char *d = e + 1;
			if (*d == '+' || *d == '-')
				d++;
			char *z = d;
			while (*z == '0' && z[1])
				z++;
			if (e[1] == '+')
				memmove(e + 1, z, strlen(z) + 1);
			else
				memmove(d, z, strlen(z) + 1);
		}
		return;
	}
	int dec = a->step < 1 ? (int)ceil(-log10(a->step) - 1e-9) : 0;
	snprintf(out, n, "%.*f", dec, v);
}

/* Tableau 10 */
static const char *const palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
				      "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
static const char *const dashes[] = {NULL, "6 3", "2 2", "8 3 2 3"};

/* Series i's colour and dashes: one colour per series, dashed after the
 * tenth; with several y columns (ny > 1) one colour per file and one dash
 * pattern per column. */
static void style_of(struct buf *b, int i, int ny)
{
	int np = (int)ARRAY_SIZE(palette);
	int colour = ny > 1 ? i / ny : i, dash = ny > 1 ? i % ny : i / np;
	svg_printf(b, "stroke=\"%s\"", palette[colour % np]);
	const char *d = dashes[dash % (int)ARRAY_SIZE(dashes)];
	if (d)
		svg_printf(b, " stroke-dasharray=\"%s\"", d);
}

/* ---- the chart ---- */

static void draw(struct buf *b, struct run *runs, int nruns, int ny, const struct axis *ax,
		 const struct axis *ay, const char *title, const char *xlabel, const char *ylabel)
{
	size_t longest = 0;
	for (int i = 0; i < nruns; i++)
		longest = MAX(longest, strlen(runs[i].label));
	double left = 78, top = 44, pw = 560, ph = 340, bottom = 56;
	double legw = 48 + 7.5 * (double)MIN(longest, 60), legh = 20.0 * nruns;
	double w = left + pw + 24 + legw + 16;
	double h = top + MAX(ph, legh) + bottom;
	double x0 = left, x1 = left + pw, y0 = top + ph, y1 = top;
	double tx0 = tr(ax, ax->lo), tx1 = tr(ax, ax->hi);
	double ty0 = tr(ay, ay->lo), ty1 = tr(ay, ay->hi);
	/* halved before subtracting, so that an axis spanning most of the doubles
	 * does not overflow into inf/inf */
#define PX(v) (x0 + (tr(ax, (v)) / 2 - tx0 / 2) / (tx1 / 2 - tx0 / 2) * (x1 - x0))
#define PY(v) (y0 + (tr(ay, (v)) / 2 - ty0 / 2) / (ty1 / 2 - ty0 / 2) * (y1 - y0))

	svg_printf(b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
	svg_printf(b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
		   "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"12\">\n",
		   w, h, w, h);
	svg_printf(b, "<title>");
	svg_text(b, title);
	svg_printf(b, "</title>\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
	svg_printf(b, "<defs><clipPath id=\"plot-area\"><rect x=\"%.1f\" y=\"%.1f\" "
		   "width=\"%.1f\" height=\"%.1f\"/></clipPath></defs>\n", x0, y1, pw, ph);
	svg_printf(b, "<text x=\"%.1f\" y=\"24\" text-anchor=\"middle\" font-size=\"15\" "
		   "font-weight=\"bold\">", x0 + pw / 2);
	svg_text(b, title);
	svg_printf(b, "</text>\n");

	/* grid and tick labels */
	char lab[64];
	svg_printf(b, "<g class=\"x-ticks\" stroke=\"#e3e3e3\">\n");
	for (int i = 0; i < ax->nticks; i++)
		svg_printf(b, "<line x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" y2=\"%.1f\"/>\n",
			   PX(ax->ticks[i]), y1, PX(ax->ticks[i]), y0);
	svg_printf(b, "</g>\n<g class=\"y-ticks\" stroke=\"#e3e3e3\">\n");
	for (int i = 0; i < ay->nticks; i++)
		svg_printf(b, "<line x1=\"%.1f\" y1=\"%.2f\" x2=\"%.1f\" y2=\"%.2f\"/>\n", x0,
			   PY(ay->ticks[i]), x1, PY(ay->ticks[i]));
	svg_printf(b, "</g>\n<g class=\"x-labels\" text-anchor=\"middle\" fill=\"#333\">\n");
	for (int i = 0; i < ax->nticks; i++) {
		tick_label(lab, sizeof(lab), ax->ticks[i], ax);
		svg_printf(b, "<text x=\"%.2f\" y=\"%.1f\">%s</text>\n", PX(ax->ticks[i]),
			   y0 + 18, lab);
	}
	svg_printf(b, "</g>\n<g class=\"y-labels\" text-anchor=\"end\" fill=\"#333\">\n");
	for (int i = 0; i < ay->nticks; i++) {
		tick_label(lab, sizeof(lab), ay->ticks[i], ay);
		svg_printf(b, "<text x=\"%.1f\" y=\"%.2f\">%s</text>\n", x0 - 6,
			   PY(ay->ticks[i]) + 4, lab);
	}
	svg_printf(b, "</g>\n<rect class=\"frame\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
		   "height=\"%.1f\" fill=\"none\" stroke=\"#666\"/>\n", x0, y1, pw, ph);
	svg_printf(b, "<text class=\"x-label\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">",
		   x0 + pw / 2, y0 + 42);
	svg_text(b, xlabel);
	svg_printf(b, "</text>\n<text class=\"y-label\" transform=\"translate(18 %.1f) "
		   "rotate(-90)\" text-anchor=\"middle\">", y1 + ph / 2);
	svg_text(b, ylabel);
	svg_printf(b, "</text>\n");

	/* one path per run */
	svg_printf(b, "<g class=\"runs\" clip-path=\"url(#plot-area)\" fill=\"none\" "
		   "stroke-width=\"1.6\" stroke-linejoin=\"round\" stroke-linecap=\"round\">\n");
	for (int i = 0; i < nruns; i++) {
		const struct run *r = &runs[i];
		svg_printf(b, "<path ");
		style_of(b, i, ny);
		svg_printf(b, " d=\"");
		for (int k = 0; k < r->n; k++)
			svg_printf(b, "%s%.2f,%.2f", k ? " L" : "M", PX(r->x[k]), PY(r->y[k]));
		if (r->n == 1)
			svg_printf(b, " l0,0");
		svg_printf(b, "\"><title>");
		svg_text(b, r->label);
		svg_printf(b, "</title></path>\n");
	}
	svg_printf(b, "</g>\n");

	/* legend, right of the plot */
	double lx = x1 + 24;
	svg_printf(b, "<g class=\"legend\">\n");
	for (int i = 0; i < nruns; i++) {
		double ly = y1 + 10 + 20.0 * i;
		svg_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
			   "stroke-width=\"2.5\" ", lx, ly, lx + 28, ly);
		style_of(b, i, ny);
		svg_printf(b, "/><text x=\"%.1f\" y=\"%.1f\">", lx + 36, ly + 4);
		svg_text(b, runs[i].label);
		svg_printf(b, "</text>\n");
	}
	svg_printf(b, "</g>\n</svg>\n");
#undef PX
#undef PY
}

/* "train loss, val loss" from the columns' axis names. */
static void join_axes(char *out, size_t n, const int *yc, int ny, const char *last_sep)
{
	size_t used = 0;
	out[0] = '\0';
	for (int j = 0; j < ny && used < n; j++) {
		int w = snprintf(out + used, n - used, "%s%s",
				 j == 0 ? "" : j == ny - 1 ? last_sep : ", ", columns[yc[j]].axis);
		if (w < 0)
			break;
		used += (size_t)w;
	}
}

int cmd_plot(int argc, char **argv, const char *prog)
{
	const char *out = NULL, *xname = "step", *title = NULL;
	double alpha = 0, ymin = NAN, ymax = NAN;
	int logx = 0, logy = 0, force = 0;
	struct opt_list labels = {0}, ynames = {0};
	const struct option options[] = {
		OPT_STRING('o', "output", &out, "OUT.svg", "write the chart here (atomically; default: standard output)"),
		OPT_STRING(0, "x", &xname, "COL", "x column: step, tokens or wall_s (default step)"),
		OPT_LIST(0, "y", &ynames, "COL", "y column: loss, val_loss, lr, grad_norm, tokens_per_s, mfu, bubble, moe_balance or moe_z (default loss); repeat it for several lines per file"),
		OPT_DOUBLE(0, "smooth", &alpha, "ALPHA", "EMA smoothing, 0 <= ALPHA < 1: s = ALPHA*s + (1-ALPHA)*y (default 0, none)"),
		OPT_FLAG(0, "logx", &logx, "logarithmic x axis"),
		OPT_FLAG(0, "logy", &logy, "logarithmic y axis"),
		OPT_DOUBLE(0, "ymin", &ymin, "Y", "lower end of the y axis (default: from the data)"),
		OPT_DOUBLE(0, "ymax", &ymax, "Y", "upper end of the y axis (default: from the data)"),
		OPT_STRING(0, "title", &title, "T", "chart title (default: 'Y against X')"),
		OPT_FLAG(0, "force", &force, "replace OUT.svg if it exists (it is kept otherwise)"),
		OPT_LIST(0, "label", &labels, "NAME", "legend label of the next file, in order (default: the file's directory name)"),
		OPT_END(),
	};
	int n = opts_parse(argc, argv, usage, options,
			   "Draw metrics files (CSV or JSON lines, as asyncpp train writes them) as an\n"
			   "SVG line chart: one line per file and y column, with a legend.");
	int xc = column_of(xname);
	if (!n)
		opts_usage_error(usage, options, "no metrics file given");
	if (xc != C_STEP && xc != C_TOKENS && xc != C_WALL)
		opts_usage_error(usage, options, "--x must be step, tokens or wall_s, not '%s'", xname);
	int ny = ynames.n ? ynames.n : 1;
	int yc[N_COL];
	if (ny > N_COL)
		opts_usage_error(usage, options, "%d --y columns; there are %d columns", ny, N_COL);
	for (int j = 0; j < ny; j++) {
		const char *yname = ynames.n ? ynames.items[j] : "loss";
		yc[j] = column_of(yname);
		if (yc[j] < 0)
			opts_usage_error(usage, options, "unknown column '%s' for --y "
					 "(expected loss, val_loss, lr, grad_norm, tokens_per_s, "
					 "mfu, bubble, moe_balance or moe_z)", yname);
		for (int k = 0; k < j; k++)
			if (yc[k] == yc[j])
				opts_usage_error(usage, options, "--y %s is given twice", yname);
	}
	if (!(alpha >= 0 && alpha < 1))
		opts_usage_error(usage, options, "--smooth must be in [0, 1), not %g", alpha);
	if (labels.n > n)
		opts_usage_error(usage, options, "%d labels for %d files", labels.n, n);
	if (!isnan(ymin) && !isnan(ymax) && !(ymin < ymax))
		opts_usage_error(usage, options, "--ymin must be below --ymax");
	if (out && strcmp(out, "-") && opts_output_is_new(out, force))
		return EXIT_FAIL;
	if (logy && ((!isnan(ymin) && ymin <= 0) || (!isnan(ymax) && ymax <= 0)))
		opts_usage_error(usage, options, "--ymin and --ymax must be positive with --logy");
	if (!isfinite(ymin) && !isnan(ymin))
		opts_usage_error(usage, options, "--ymin must be finite");
	if (!isfinite(ymax) && !isnan(ymax))
		opts_usage_error(usage, options, "--ymax must be finite");

	/* series i*ny + j: file i, column j */
	int nseries = n * ny;
	struct run *runs = xcalloc((size_t)nseries, sizeof(*runs));
	int rc = EXIT_OK;
	double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY;
	int unread = -1; /* the file that could not be read: said once */
	for (int i = 0; i < nseries; i++) {
		int f = i / ny, j = i % ny;
		struct run *r = &runs[i];
		if (f == unread)
			continue;
		r->path = argv[f];
		char *file_label = f < labels.n ? xstrdup(labels.items[f]) : default_label(argv[f]);
		if (ny == 1) {
			r->label = file_label;
		} else if (n == 1 && !labels.n) { /* one file: its columns name the lines */
			r->label = xstrdup(columns[yc[j]].name);
			free(file_label);
		} else {
			size_t len = strlen(file_label) + strlen(columns[yc[j]].name) + 2;
			r->label = xmalloc(len);
			snprintf(r->label, len, "%s %s", file_label, columns[yc[j]].name);
			free(file_label);
		}
		int failed = load_run(r, xc, yc[j], logx, logy, alpha);
		if (failed) {
			unread = failed > 0 ? f : unread;
			rc = EXIT_FAIL;
			continue;
		}
		for (int k = 0; k < r->n; k++) {
			xlo = fmin(xlo, r->x[k]);
			xhi = fmax(xhi, r->x[k]);
			ylo = fmin(ylo, r->y[k]);
			yhi = fmax(yhi, r->y[k]);
		}
	}
	if (rc == EXIT_OK) {
		struct axis ax = {.log = logx}, ay = {.log = logy};
		axis_setup(&ax, xlo, xhi, 0, 0);
		int fixed = !isnan(ymin) || !isnan(ymax);
		if (!isnan(ymin))
			ylo = ymin;
		if (!isnan(ymax))
			yhi = ymax;
		if (fixed && !(ylo < yhi)) { /* a one-sided limit beyond every point */
			if (!isnan(ymin))
				yhi = logy ? ylo * 10 : ylo + 1;
			else
				ylo = logy ? yhi / 10 : yhi - 1;
		}
		/* a margin at each end the data decides, none at an end the user set */
		axis_setup(&ay, ylo, yhi, isnan(ymin) ? 0.04 : 0, isnan(ymax) ? 0.04 : 0);
		char axes[512], ylabel[560], deftitle[560];
		join_axes(axes, sizeof(axes), yc, ny, ", ");
		if (alpha > 0)
			snprintf(ylabel, sizeof(ylabel), "%s (EMA %g)", axes, alpha);
		else
			snprintf(ylabel, sizeof(ylabel), "%s", axes);
		join_axes(axes, sizeof(axes), yc, ny, " and ");
		snprintf(deftitle, sizeof(deftitle), "%s against %s", axes, columns[xc].axis);
		struct buf b = {0};
		draw(&b, runs, nseries, ny, &ax, &ay, title ? title : deftitle, columns[xc].axis,
		     ylabel);
		if (svg_save(&b, out))
			rc = EXIT_FAIL;
		buf_free(&b);
	}
	for (int i = 0; i < nseries; i++) {
		free(runs[i].label);
		free(runs[i].x);
		free(runs[i].y);
	}
	free(runs);
	free(labels.items);
	free(ynames.items);
	return rc;
}
