/* lr.c - the learning-rate schedule: linear warmup, then cosine, linear,
 * warmup-stable-decay or constant. See lr_at in optim.h for the formulas. */
#include <math.h>
#include <string.h>

#include "optim.h"

double lr_at(const struct config *cfg, long step)
{
	double lr = cfg->optim_lr, lo = cfg->optim_min_lr_ratio * cfg->optim_lr;
	const char *kind = cfg->optim_decay ? cfg->optim_decay : "cosine";
	long W = cfg->optim_warmup > 0 ? cfg->optim_warmup : 0;
	long N = cfg->train_steps;
	double p;

	if (W > 0 && step <= W)
		return lr * (double)(step > 0 ? step : 0) / (double)W;
	if (!strcmp(kind, "constant"))
		return lr;
	if (!strcmp(kind, "wsd")) {
		double frac = cfg->optim_wsd_decay_frac;
		long D;

		if (!(frac >= 0.0))
			frac = 0.0;
		if (frac > 1.0)
			frac = 1.0;
		D = N - (long)floor(frac * (double)N + 0.5);
		if (D < W)
			D = W;
		if (step <= D)
			return lr;
		if (step >= N)
			return lo;
		return lr - (lr - lo) * (double)(step - D) / (double)(N - D);
	}
	if (N <= W || step >= N)
		p = 1.0;
	else
		p = (double)(step - W) / (double)(N - W);
	if (!strcmp(kind, "linear"))
		return lr - (lr - lo) * p;
	return lo + (lr - lo) * 0.5 * (1.0 + cos(M_PI * p));
}
