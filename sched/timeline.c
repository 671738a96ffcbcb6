/* timeline.c - draw a simulated schedule: a text timeline, one row per
 * stage, and an SVG with a box per operation.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../io/util.h"
#include "schedule.h"

static int is_compute(enum sched_op op)
{
	return op == SCHED_FORWARD || op == SCHED_BACKWARD || op == SCHED_OPTIM_STEP ||
	       op == SCHED_BACKWARD_INPUT || op == SCHED_BACKWARD_WEIGHT;
}

static int digits(long v)
{
	int d = 1;
	while (v >= 10)
		v /= 10, d++;
	return d;
}

static char op_letter(enum sched_op op)
{
	return op == SCHED_FORWARD ? 'F'
	       : op == SCHED_BACKWARD || op == SCHED_BACKWARD_INPUT ? 'B'
	       : op == SCHED_BACKWARD_WEIGHT ? 'W' : 'U';
}

/* The chunk's letter in a cell (a for chunk 0, ...), none with one chunk. */
static const char *chunk_letter(const struct schedule *sc, const struct sched_action *a,
				char out[2])
{
	out[0] = sc->V > 1 && a->op != SCHED_OPTIM_STEP ? (char)('a' + a->chunk % 26) : 0;
	out[1] = 0;
	return out;
}

/* The time one text column stands for: the shortest op that takes time. */
static double quantum(const struct schedule *sc, const struct sim_result *r)
{
	double q = INFINITY;
	for (int s = 0; s < sc->S; s++)
		for (int i = 0; i < sc->stage[s].n; i++) {
			double d = r->end[s][i] - r->start[s][i];
			if (is_compute(sc->stage[s].a[i].op) && d > 0 && d < q)
				q = d;
		}
	return isfinite(q) ? q : 1;
}

/* Write text, padded to cw and a blank, into cell c (no NUL). */
static void put_cell(char *cells, long c, int cw, const char *text)
{
	char tmp[64];
	snprintf(tmp, sizeof(tmp), "%-*s ", cw, text);
	memcpy(cells + c * (cw + 1), tmp, (size_t)cw + 1);
}

static long to_col(double t, double q)
{
	return lround(t / q);
}

void sched_print_timeline(FILE *fp, const struct schedule *sc, const struct sim_result *r,
			  int width, int max_rows)
{
	int S = sc->S;
	double q = quantum(sc, r);
	long ncols = to_col(r->makespan, q);
	int nupd = sc->kind == SCHED_PIPEDREAM ? sc->n_mb : sc->n_steps;
	int cw = 1 + digits(MAX(sc->n_mb - 1, nupd - 1)) + (sc->V > 1);
	int label = 6 + digits(S - 1);
	int rows = max_rows > 0 && S > max_rows ? max_rows : S;
	long vis = (width - label - 2) / (cw + 1);
	if (vis < 1)
		vis = 1;
	if (vis > ncols)
		vis = ncols;

	if (sched_kind_split(sc->kind))
		fprintf(fp, "timeline (one column = %g time unit%s; F forward, B input gradient, "
			"W weight gradient of a micro-batch%s, U optimizer step, - continued, . "
			"idle):\n", q, q == 1 ? "" : "s", sc->V > 1 ? " (a, b: its chunk)" : "");
	else
		fprintf(fp, "timeline (one column = %g time unit%s; F/B forward/backward of a "
			"micro-batch%s, U optimizer step, - continued, . idle):\n", q,
			q == 1 ? "" : "s", sc->V > 1 ? " (a, b, ...: its chunk)" : "");
	char *cells = xmalloc(st_mult((size_t)vis + 1, (size_t)cw + 1));
	char *owner = xmalloc((size_t)vis + 1);
	for (int s = 0; s < rows; s++) {
		const struct sched_stage *st = &sc->stage[s];
		memset(owner, 0, (size_t)vis + 1);
		for (long c = 0; c < vis; c++)
			put_cell(cells, c, cw, ".");
		for (int i = 0; i < st->n; i++) {
			const struct sched_action *a = &st->a[i];
			if (!is_compute(a->op) || !(r->end[s][i] > r->start[s][i]))
				continue;
			long c0 = to_col(r->start[s][i], q), c1 = to_col(r->end[s][i], q);
			if (c1 <= c0)
				c1 = c0 + 1;
			for (long c = c0; c < c1 && c < vis; c++) {
				char text[32], ch[2];
				if (c == c0)
					snprintf(text, sizeof(text), "%c%d%s", op_letter(a->op),
						 a->op == SCHED_OPTIM_STEP ? a->step : a->mb,
						 chunk_letter(sc, a, ch));
				else
					snprintf(text, sizeof(text), "-");
				if (owner[c])
					continue;
				owner[c] = 1;
				put_cell(cells, c, cw, text);
			}
		}
		/* trim trailing blanks of the row */
		size_t len = (size_t)vis * (cw + 1);
		while (len && cells[len - 1] == ' ')
			len--;
		fprintf(fp, "stage %*d | %.*s\n", label - 6, s, (int)len, cells);
	}
	if (vis < ncols)
		fprintf(fp, "(truncated: %ld of %ld columns shown; use --svg for all)\n", vis, ncols);
	if (rows < S)
		fprintf(fp, "(truncated: %d of %d stages shown)\n", rows, S);
	free(cells);
	free(owner);
}

/* ---- SVG ---- */

static void PRINTF_LIKE(2, 3) bprintf(struct buf *b, const char *fmt, ...)
{
	char tmp[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n < sizeof(tmp)) {
		buf_append(b, tmp, (size_t)n);
		return;
	}
	char *big = xmalloc((size_t)n + 1);
	va_start(ap, fmt);
	vsnprintf(big, (size_t)n + 1, fmt, ap);
	va_end(ap);
	buf_append(b, big, (size_t)n);
	free(big);
}

/* A round tick step giving about `want` ticks over span. */
static double tick_step(double span, int want)
{
	double raw = span / want, p = pow(10, floor(log10(raw))), f = raw / p;
	return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

static const char *op_color(enum sched_op op)
{
	return op == SCHED_FORWARD ? "#4c78a8"
	       : op == SCHED_BACKWARD || op == SCHED_BACKWARD_INPUT ? "#54a24b"
	       : op == SCHED_BACKWARD_WEIGHT ? "#b279a2" : "#f58518";
}

/* Later chunks are drawn lighter: chunk c of V at opacity 1 down to 0.45. */
static double chunk_opacity(const struct schedule *sc, const struct sched_action *a)
{
	if (sc->V < 2 || a->op == SCHED_OPTIM_STEP)
		return 1;
	return 1 - 0.55 * a->chunk / (sc->V - 1);
}

int sched_write_svg(const char *path, const struct schedule *sc, const struct sim_result *r)
{
	int S = sc->S;
	double left = 80, right = 20, top = 56, rowh = S > 32 ? 12 : 24, gap = S > 32 ? 1 : 4;
	double plotw = 1200, h = top + S * rowh + 50, w = left + plotw + right;
	double span = r->makespan > 0 ? r->makespan : 1, xs = plotw / span;
	struct buf b = {0};
	long nops = 0;
	for (int s = 0; s < S; s++)
		nops += sc->stage[s].n;
	int tips = nops <= 50000;

	bprintf(&b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
		"viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"11\">\n",
		w, h, w, h);
	bprintf(&b, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
	char ftext[64], vtext[64] = "";
	double formula = sched_bubble_published(sc, ftext, sizeof(ftext));
	if (formula < 0)
		formula = sched_bubble_formula(S, sc->M), snprintf(ftext, sizeof(ftext), "1f1b's");
	if (sc->V > 1)
		snprintf(vtext, sizeof(vtext), ", %d chunks per stage (later ones lighter)", sc->V);
	bprintf(&b, "<text x=\"%.0f\" y=\"18\" font-size=\"14\">%s: %d stages, %d micro-batches "
		"per step, %d steps%s; bubble %.4f (%s %.4f)</text>\n", left,
		sched_kind_name(sc->kind), S, sc->M, sc->n_steps, vtext, r->bubble, ftext, formula);
	/* legend */
	static const struct { enum sched_op op; const char *name; } legend_fused[] = {
		{SCHED_FORWARD, "forward"}, {SCHED_BACKWARD, "backward"},
		{SCHED_OPTIM_STEP, "optimizer step"},
	}, legend_split[] = {
		{SCHED_FORWARD, "forward"}, {SCHED_BACKWARD_INPUT, "input gradient (B)"},
		{SCHED_BACKWARD_WEIGHT, "weight gradient (W)"}, {SCHED_OPTIM_STEP, "optimizer step"},
	};
	int split = sched_kind_split(sc->kind);
	size_t nleg = split ? ARRAY_SIZE(legend_split) : ARRAY_SIZE(legend_fused);
	for (size_t k = 0; k < nleg; k++) {
		const char *name = split ? legend_split[k].name : legend_fused[k].name;
		enum sched_op op = split ? legend_split[k].op : legend_fused[k].op;
		double x = left + k * 150;
		bprintf(&b, "<rect x=\"%.0f\" y=\"28\" width=\"14\" height=\"12\" fill=\"%s\"/>"
			"<text x=\"%.0f\" y=\"38\">%s</text>\n", x, op_color(op), x + 18, name);
	}
	for (int s = 0; s < S; s++) {
		const struct sched_stage *st = &sc->stage[s];
		double y = top + s * rowh;
		bprintf(&b, "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">stage %d</text>\n",
			left - 6, y + rowh / 2 + 4, s);
		bprintf(&b, "<rect x=\"%.0f\" y=\"%.1f\" width=\"%.0f\" height=\"%.1f\" "
			"fill=\"#f2f2f2\"/>\n", left, y, plotw, rowh - gap);
		for (int i = 0; i < st->n; i++) {
			const struct sched_action *a = &st->a[i];
			if (!is_compute(a->op))
				continue;
			double x0 = left + r->start[s][i] * xs;
			double bw = (r->end[s][i] - r->start[s][i]) * xs;
			if (bw <= 0) {
				if (a->op != SCHED_OPTIM_STEP)
					continue;
				bw = 1.5; /* an instantaneous update: a marker */
			}
			bprintf(&b, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" "
				"fill=\"%s\" stroke=\"white\" stroke-width=\"0.5\"", x0, y, bw,
				rowh - gap, op_color(a->op));
			if (chunk_opacity(sc, a) < 1)
				bprintf(&b, " fill-opacity=\"%.2f\"", chunk_opacity(sc, a));
			char ct[24] = "";
			if (sc->V > 1 && a->op != SCHED_OPTIM_STEP)
				snprintf(ct, sizeof(ct), " chunk %d", a->chunk);
			if (tips) /* hover text, left out of large drawings */
				bprintf(&b, "><title>stage %d %s %s %d%s v%d [%g, %g]</title></rect>\n",
					s, sched_op_name(a->op),
					a->op == SCHED_OPTIM_STEP ? "step" : "mb",
					a->op == SCHED_OPTIM_STEP ? a->step : a->mb, ct, a->version,
					r->start[s][i], r->end[s][i]);
			else
				bprintf(&b, "/>\n");
			int nd = digits(a->op == SCHED_OPTIM_STEP ? a->step : a->mb);
			if (bw >= 7 * nd + 4 && rowh >= 16)
				bprintf(&b, "<text x=\"%.2f\" y=\"%.1f\" fill=\"white\" "
					"text-anchor=\"middle\">%d</text>\n", x0 + bw / 2,
					y + rowh / 2 + 3, a->op == SCHED_OPTIM_STEP ? a->step : a->mb);
		}
	}
	/* time axis */
	double ya = top + S * rowh + 4, step = tick_step(span, 10);
	bprintf(&b, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"black\"/>\n",
		left, ya, left + plotw, ya);
	for (double t = 0; t <= span * (1 + 1e-9); t += step) {
		double x = left + t * xs;
		bprintf(&b, "<line x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" y2=\"%.1f\" stroke=\"black\"/>"
			"<text x=\"%.2f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>\n", x, ya, x,
			ya + 5, x, ya + 18, t);
	}
	bprintf(&b, "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"middle\">time</text>\n",
		left + plotw / 2, ya + 34);
	bprintf(&b, "</svg>\n");

	/* atomic_* name the path in their messages; commit aborts a failed write */
	struct atomic_file af;
	int ret = atomic_open(&af, path);
	if (!ret) {
		atomic_write(&af, b.data, b.len);
		ret = atomic_commit(&af);
	}
	buf_free(&b);
	if (ret)
		return -1;
	return 0;
}
