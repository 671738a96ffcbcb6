#!/usr/bin/env python3
"""report.py - the grid's plan, results.csv, plots and README.md.

Python 3 standard library only. experiments/run.sh calls it:

  report.py plan PHASE     the runs of a phase (A to G), one per line:
                           NAME KEY=VALUE... (a phase's plan grows with the
                           results of the phases before it, and E's with its
                           own: run.sh plans a phase again until nothing new)
  report.py best OPT ARM   the best learning rate of an arm so far
  report.py status         finished / missing runs
  report.py all            results.csv, plots/*.svg (with asyncpp plot) and
                           README.md from the runs finished so far

A run lives in WORK/runs/NAME: config.ini (the effective configuration, as
asyncpp train --print-config writes it), metrics.csv, log.txt, and 'done'
(status, wall_s, cpu_s, code) once it has finished.

Environment: ONLY_OPT (a comma-separated list of optimizers) keeps only the
planned runs of those optimizers; LONG_STEPS replaces the long horizon's step
count (phase F) computed from 20 tokens per parameter.
"""
import argparse
import configparser
import csv
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile

# Phases A-D (finished grids keep their names and meaning): four optimizers, three arms
OPTIMIZERS = ['adamw', 'muon', 'lion', 'sgd']
HEADLINE = ['adamw', 'muon']
ARMS = ['sync', 'async', 'async-ef']
# Phases E-G: the paper's other optimizers and the weight-prediction arm
NEW_OPTIMIZERS = ['adan', 'mars', 'ademamix', 'soap', 'normuon']
ALL_OPTIMIZERS = OPTIMIZERS + NEW_OPTIMIZERS
ARMS4 = ARMS + ['async-predict']
LRS = {
    'adamw': ['1e-3', '3e-3', '1e-2'],
    'muon': ['3e-3', '1e-2', '3e-2'],
    'lion': ['1e-4', '3e-4', '1e-3'],
    'sgd': ['3e-2', '1e-1', '3e-1'],
    # AdamW's grid for the Adam-like ones (Adan's and SOAP's papers use 1e-3 and 3e-3,
    # MARS-AdamW about 3e-3 at GPT-2 small); AdEMAMix one step lower, since its slow
    # average (alpha 5) enlarges the update; NorMuon Muon's (same rms scale)
    'adan': ['1e-3', '3e-3', '1e-2'],
    'mars': ['1e-3', '3e-3', '1e-2'],
    'ademamix': ['3e-4', '1e-3', '3e-3'],
    'soap': ['1e-3', '3e-3', '1e-2'],
    'normuon': ['3e-3', '1e-2', '3e-2'],
}
ARM_SETS = {
    'sync': ['train.delay=0', 'optim.correction=none'],
    'async': ['train.delay=1', 'optim.correction=none'],
    'async-ef': ['train.delay=1', 'optim.correction=ef', 'optim.ef_lambda=1'],
    'async-predict': ['train.delay=1', 'optim.correction=predict'],
}
MOMENTA = ['0.9', '0.95', '0.98']
# the momentum each optimizer runs with in the grids (its paper's default, which
# optim.name selects), and the key that sets it
DEFAULT_MOMENTUM = {'adamw': 0.9, 'muon': 0.95, 'lion': 0.9, 'sgd': 0.95, 'adan': 0.98,
                    'mars': 0.95, 'ademamix': 0.9, 'soap': 0.95, 'normuon': 0.95}
MOMENTUM_KEY = {'adamw': 'beta1', 'muon': 'momentum', 'lion': 'beta1', 'sgd': 'momentum',
                'adan': 'beta1', 'mars': 'beta1', 'ademamix': 'beta1', 'soap': 'beta1',
                'normuon': 'momentum'}
STAGES = [2, 4, 8]
ARM_NAMES = {'sync': 'sync', 'async': 'async', 'async-ef': 'async + EF',
             'async-predict': 'async + predict'}

# The paper's grouping (arXiv 2606.30634; /work/shared/REFERENCES.md): the hypothesis
# phase E tests. AdEMAMix and SGD are not placed by the paper: measured, no verdict.
PAPER_GROUP = {'adamw': 'degrades', 'mars': 'degrades',
               'lion': 'in between', 'soap': 'in between', 'adan': 'in between',
               'muon': 'robust', 'normuon': 'robust'}
GROUP_ORDER = ['robust', 'in between', 'degrades']

# ---- the decision rules, fixed before any run of phases E-G (commit them with the plan;
# never change them after seeing results). Gaps are final val loss, async arm minus sync
# arm, each arm at its own best lr of the 4-arm grid (seed 1), in nats; "both seeds" means
# the gap computed within seed 1 and within seed 2 (seed 2 rerun at seed 1's best lrs).
RULE_X = 0.10  # "degrades": mean gap > X and the gap > 0 in both seeds
RULE_Y = 0.05  # "robust": mean gap < Y and the gap < Y in both seeds
RULE_N = 0.03  # noise: twice the largest seed spread of grid C (0.0142 nats)
RULE_Z = 0.50  # EF "closes" the gap: async+EF gap <= Z x async gap in both seeds
RULE_R = 2 / 3  # "degrades" like AdamW: mean gap >= R x AdamW's mean gap
TPP = 20       # phase F: tokens per parameter (Chinchilla)
MOE = ['model.n_expert=4', 'model.top_k=2', 'model.d_expert=192']  # phase G

COLUMNS = ['name', 'optimizer', 'arm', 'schedule', 'delay', 'delay_mode', 'correction',
           'lr', 'beta1', 'momentum', 'stages', 'micro_batches', 'batch_size', 'n_layer',
           'd_model', 'n_expert', 'seed', 'steps', 'status', 'final_train_loss', 'final_val_loss',
           'tokens', 'wall_s', 'cpu_s', 'code']


def fmt_lr(x):
    return repr(float(x))


# ---------------------------------------------------------------- reading runs

def read_config(path):
    cp = configparser.ConfigParser(interpolation=None, strict=False)
    with open(path) as f:
        cp.read_file(f)
    return cp


def read_metrics(path):
    """Training losses, evaluations and tokens; a resumed run appends to its metrics, and
    rows logged after a resume replace the earlier ones from their step on."""
    losses, vals, tokens = [], [], 0.0

    def put(xs, step, v):
        while xs and xs[-1][0] >= step:
            xs.pop()
        xs.append((step, v))
    with open(path, newline='') as f:
        for row in csv.DictReader(f):
            if row.get('tokens'):
                tokens = max(tokens, float(row['tokens']))
            if row.get('loss'):
                put(losses, int(float(row['step'])), float(row['loss']))
            if row.get('val_loss'):
                put(vals, int(float(row['step'])), float(row['val_loss']))
    return losses, vals, tokens


def arm_of(r):
    if r['schedule'] == '2bw':
        return '2bw-pipeline'
    if r['schedule'] != 'none':
        return r['schedule']
    if r['delay_mode'] == 'per-stage':
        return 'pipedream-S%d' % r['stages']
    if r['delay'] == 0:
        return 'sync'
    if r['delay'] == 1:
        return {'ef': 'async-ef', 'predict': 'async-predict'}.get(r['correction'], 'async')
    return 'delay%d' % r['delay']


def load_runs(work):
    runs = []
    rdir = os.path.join(work, 'runs')
    if not os.path.isdir(rdir):
        return runs
    for name in sorted(os.listdir(rdir)):
        d = os.path.join(rdir, name)
        done = os.path.join(d, 'done')
        if not os.path.isfile(done):
            continue
        info = dict(line.strip().split('=', 1) for line in open(done) if '=' in line)
        cp = read_config(os.path.join(d, 'config.ini'))
        r = {
            'name': name,
            'optimizer': cp['optim']['name'],
            'schedule': cp['train']['schedule'],
            'delay': int(cp['train']['delay']),
            'delay_mode': cp['train']['delay_mode'],
            'correction': cp['optim']['correction'],
            'lr': float(cp['optim']['lr']),
            'beta1': float(cp['optim']['beta1']),
            'momentum': float(cp['optim']['momentum']),
            'stages': int(cp['pipeline']['stages']),
            'micro_batches': int(cp['pipeline']['micro_batches']),
            'batch_size': int(cp['train']['batch_size']),
            'n_layer': int(cp['model']['n_layer']),
            'd_model': int(cp['model']['d_model']),
            # configurations written before the MoE keys existed have none
            'n_expert': int(cp['model'].get('n_expert', '0')),
            'seed': int(cp['train']['seed']),
            'steps': int(cp['train']['steps']),
            'status': info.get('status', '?'),
            'wall_s': float(info.get('wall_s', 'nan')),
            'cpu_s': float(info.get('cpu_s', 'nan')),
            # the code that made the run (commit, -dirty), recorded since
            # run.sh learnt to; empty for the runs made before
            'code': info.get('code', ''),
            'dir': d,
        }
        r['arm'] = arm_of(r)
        losses, vals, tokens = read_metrics(os.path.join(d, 'metrics.csv'))
        r['losses'], r['vals'], r['tokens'] = losses, vals, tokens
        ok = r['status'] == 'ok'
        last = [l for _, l in losses[-10:]]
        r['final_train_loss'] = statistics.fmean(last) if ok and last else math.nan
        r['final_val_loss'] = vals[-1][1] if ok and vals and vals[-1][0] == r['steps'] \
            else math.nan
        runs.append(r)
    return runs


def params_of(r):
    """The parameter count of a run's model, from the start line of a 0-step run of its
    configuration ('asyncpp: training llama, N parameters'); 0 if that fails."""
    with tempfile.TemporaryDirectory(prefix='report-params.') as tmp:
        res = subprocess.run([ASYNCPP, 'train', '-c', os.path.join(r['dir'], 'config.ini'),
                              '--set', 'train.steps=0', '--set', 'eval.every=0',
                              '--set', 'train.out_dir=' + tmp], capture_output=True,
                             text=True)
    m = re.search(r'training \S+, (\d+) parameters', res.stderr + res.stdout)
    return int(m.group(1)) if res.returncode == 0 and m else 0


def momentum_of(r):
    return r[MOMENTUM_KEY[r['optimizer']]]


def is_short(r):
    """Not the long horizon (phase F) and not the MoE (phase G): the grids' length and model."""
    return not r['name'].startswith('long-') and r['n_expert'] == 0


def is_base(r):
    """A grid run (A, C, E): the 4-layer dense model, one micro-batch, default momentum,
    the grids' number of steps."""
    return (r['n_layer'] == 4 and r['micro_batches'] == 1 and r['batch_size'] == 16 and
            r['stages'] == 1 and r['schedule'] == 'none' and is_short(r) and
            abs(momentum_of(r) - DEFAULT_MOMENTUM[r['optimizer']]) < 1e-12)


def val_key(r):
    v = r['final_val_loss']
    return v if not math.isnan(v) else math.inf


def find(runs, **kw):
    out = []
    for r in runs:
        if all((abs(r[k] - v) < 1e-12 * max(1, abs(v))) if isinstance(v, float) else r[k] == v
               for k, v in kw.items()):
            out.append(r)
    return out


def neighbour(lr, direction):
    """The next value of the 1-3-10 ladder below (-1) or above (+1) lr: 1e-3 -> 3e-4, 3e-3."""
    m, e = lr.split('e')
    e = int(e)
    if m == '1':
        return '3e%d' % (e - 1) if direction < 0 else '3e%d' % e
    return '1e%d' % e if direction < 0 else '1e%d' % (e + 1)


def base_runs(runs, opt, arm, lrs, seed=1):
    return [r for r in runs if is_base(r) and r['optimizer'] == opt and r['arm'] == arm and
            r['seed'] == seed and any(abs(r['lr'] - float(x)) < 1e-12 for x in lrs)]


def extension_or_none(runs, opt, arms=ARMS):
    """The grid grows by one value past an end where some arm's best lr sits, the same value
    for every arm, once the whole base grid of the optimizer has finished (None before).
    One step only."""
    base = LRS[opt]
    ext = []
    bests = []
    for arm in arms:
        rs = base_runs(runs, opt, arm, base)
        if len(rs) < len(base):
            return None
        bests.append(min(rs, key=val_key)['lr'])
    if any(abs(b - float(base[0])) < 1e-12 for b in bests):
        ext.append(neighbour(base[0], -1))
    if any(abs(b - float(base[-1])) < 1e-12 for b in bests):
        ext.append(neighbour(base[-1], +1))
    return ext


def extension(runs, opt, arms=ARMS):
    return extension_or_none(runs, opt, arms) or []


def grid(runs, opt):
    """The learning rates of an optimizer in phases A-D, ascending: the base grid and its
    extension by the three arms' best lrs."""
    return sorted(LRS[opt] + extension(runs, opt), key=float)


def grid4(runs, opt):
    """The learning rates of an optimizer in phases E-G: the base grid, extended by the same
    rule over the four arms (for adamw, muon, lion and sgd this adds to the extension of
    phases B and D only an end that the predict arm's best lr alone sits at)."""
    lrs = set(LRS[opt]) | set(extension(runs, opt, ARMS4))
    if opt in OPTIMIZERS:
        lrs |= set(extension(runs, opt))
    return sorted(lrs, key=float)


def grid4_done(runs, opt):
    """Every arm of the 4-arm grid has finished, the grid is final (seed 1)."""
    if extension_or_none(runs, opt, ARMS4) is None:
        return False
    lrs = grid4(runs, opt)
    return all(len(base_runs(runs, opt, arm, [lr])) == 1 for arm in ARMS4 for lr in lrs)


def best_run(runs, opt, arm, seed=1, lrs=None):
    """The run of (opt, arm) with the lowest final val loss over the lr grid (phases A-D's
    unless lrs is given)."""
    cand = base_runs(runs, opt, arm, grid(runs, opt) if lrs is None else lrs, seed)
    if not cand:
        return None
    return min(cand, key=val_key)


def best4(runs, opt, arm):
    """The best run of seed 1 over the 4-arm grid (phases E-G)."""
    return best_run(runs, opt, arm, lrs=grid4(runs, opt))


# ---------------------------------------------------------------- the plan

def grid_runs(opt, lrs, arms=ARMS):
    return [('%s-%s-lr%s-s1' % (opt, arm, lr), ['optim.name=' + opt, 'optim.lr=' + lr] +
             ARM_SETS[arm]) for lr in lrs for arm in arms]


def seed2_run(opt, arm, lr):
    return ('%s-%s-lr%s-s2' % (opt, arm, lr),
            ['optim.name=' + opt, 'optim.lr=' + lr, 'train.seed=2'] + ARM_SETS[arm])


ASYNCPP = None  # the binary plan G asks whether it knows model.n_expert (set by main)
_moe_known = None


def moe_supported():
    """Whether the binary accepts the MoE keys (an MoE implementation is merged apart)."""
    global _moe_known
    if _moe_known is None:
        try:
            res = subprocess.run([ASYNCPP, 'train', '--print-config'] +
                                 [x for kv in MOE for x in ('--set', kv)],
                                 capture_output=True, text=True)
            _moe_known = res.returncode == 0
        except OSError:
            _moe_known = False
    return _moe_known


_shape = {}


def grid_shape(runs):
    """(parameters, tokens per step) of the grids' model, from a finished grid run; None
    before one exists."""
    for r in runs:
        if is_base(r) and r['status'] == 'ok' and r['tokens'] and r['steps']:
            if r['dir'] not in _shape:
                _shape[r['dir']] = params_of(r)
            if _shape[r['dir']]:
                return _shape[r['dir']], r['tokens'] / r['steps']
    return None


def long_steps(runs):
    """Phase F's steps: TPP tokens per parameter (LONG_STEPS replaces it)."""
    if os.environ.get('LONG_STEPS'):
        return int(os.environ['LONG_STEPS'])
    shape = grid_shape(runs)
    if not shape:
        return 0
    params, per_step = shape
    return int(math.ceil(TPP * params / per_step))


def long_arms(opt):
    """The long horizon's arms: sync and async; Muon also async + EF, the paper's 360M
    figure (sync 2.578, async 2.590, async + correction 2.583)."""
    return ['sync', 'async'] + (['async-ef'] if opt == 'muon' else [])


def plan(phase, runs):
    """(name, [key=value...]) for every run of a phase. Each phase is planned when it
    starts, from the results of the phases before it:
      A  adamw, muon: 3 arms x the base lr grid
      B  adamw, muon: the grid's extension (one lr past an end where an arm's best sits)
      C  seed 2 of the headline cells; momentum; constant vs variable delay (8 layers);
         lion, sgd: 3 arms x the base lr grid
      D  the 2bw pipeline check; lion, sgd: the grid's extension
      E  adan, mars, ademamix, soap, normuon: 4 arms (with async + predict) x the base lr
         grid; adamw, muon, lion, sgd: async + predict over their grid; then the 4-arm
         extension of every grid; then seed 2 of every optimizer's best cell per arm
         (lion's and sgd's seed 2 among them)
      F  the long horizon: adamw and muon, sync and async (muon also async + EF) at the best
         sync lr, TPP tokens per parameter, val loss every 2% of the run
      G  MoE (when the binary knows model.n_expert): adamw and muon, sync / async / async+EF
         at the best dense sync lr"""
    out = []
    if phase == 'A':
        for opt in HEADLINE:
            out += grid_runs(opt, LRS[opt])
    elif phase == 'B':
        for opt in HEADLINE:
            out += grid_runs(opt, extension(runs, opt))
    elif phase == 'C':
        for opt in HEADLINE:  # a second seed of the headline cells, at each arm's best lr
            for arm in ARMS:
                b = best_run(runs, opt, arm)
                if b:
                    lr = fmt_lr(b['lr'])
                    out.append(('%s-%s-lr%s-s2' % (opt, arm, lr),
                                ['optim.name=' + opt, 'optim.lr=' + lr, 'train.seed=2'] +
                                ARM_SETS[arm]))
        for opt in HEADLINE:  # momentum, at the best sync lr
            b = best_run(runs, opt, 'sync')
            if not b:
                continue
            lr = fmt_lr(b['lr'])
            for mom in MOMENTA:
                if abs(float(mom) - DEFAULT_MOMENTUM[opt]) < 1e-12:
                    continue  # grid A's run
                for arm in ['sync', 'async']:
                    out.append(('%s-%s-lr%s-m%s-s1' % (opt, arm, lr, mom),
                                ['optim.name=' + opt, 'optim.lr=' + lr,
                                 'optim.%s=%s' % (MOMENTUM_KEY[opt], mom)] + ARM_SETS[arm]))
        for opt in ['muon', 'adamw']:  # constant against variable delay, 8 layers
            b = best_run(runs, opt, 'sync')
            if not b:
                continue
            lr = fmt_lr(b['lr'])
            base = ['model.n_layer=8', 'optim.name=' + opt, 'optim.lr=' + lr]
            out.append(('L8-%s-sync-lr%s-s1' % (opt, lr), base + ['train.delay=0']))
            out.append(('L8-%s-2bw-lr%s-s1' % (opt, lr), base + ['train.delay=1']))
            for S in STAGES:
                out.append(('L8-%s-pipedream-S%d-lr%s-s1' % (opt, S, lr),
                            base + ['train.delay=0', 'train.delay_mode=per-stage',
                                    'pipeline.stages=%d' % S, 'pipeline.micro_batches=1']))
        for opt in ['lion', 'sgd']:
            out += grid_runs(opt, LRS[opt])
    elif phase == 'D':
        pipe = ['optim.name=adamw', 'optim.lr=3e-3', 'train.batch_size=4',
                'pipeline.micro_batches=4']
        out.append(('check-delay1-M4', pipe + ['train.delay=1']))
        out.append(('check-2bw-S4-M4', pipe + ['train.schedule=2bw', 'pipeline.stages=4']))
        for opt in ['lion', 'sgd']:
            out += grid_runs(opt, extension(runs, opt))
    elif phase == 'E':
        for opt in NEW_OPTIMIZERS:
            out += grid_runs(opt, grid4(runs, opt), ARMS4)
        for opt in OPTIMIZERS:
            old = grid(runs, opt)
            out += grid_runs(opt, grid4(runs, opt), ['async-predict'])
            out += grid_runs(opt, [lr for lr in grid4(runs, opt) if lr not in old], ARMS)
        for opt in ALL_OPTIMIZERS:  # seed 2, once the optimizer's grid is final
            if not grid4_done(runs, opt):
                continue
            for arm in ARMS4:
                b = best4(runs, opt, arm)
                if b:
                    out.append(seed2_run(opt, arm, fmt_lr(b['lr'])))
    elif phase == 'F':
        T = long_steps(runs)
        if T:
            for opt in HEADLINE:
                b = best4(runs, opt, 'sync')
                if not b:
                    continue
                lr = fmt_lr(b['lr'])
                for arm in long_arms(opt):
                    # a checkpoint every 500 steps: run.sh continues a cut-off run from it
                    out.append(('long-%s-%s-lr%s-T%d-s1' % (opt, arm, lr, T),
                                ['optim.name=' + opt, 'optim.lr=' + lr, 'train.steps=%d' % T,
                                 'eval.every=%d' % max(5, T // 50), 'checkpoint.every=500'] +
                                ARM_SETS[arm]))
    elif phase == 'G':
        if moe_supported():
            for opt in HEADLINE:
                b = best4(runs, opt, 'sync')
                if not b:
                    continue
                lr = fmt_lr(b['lr'])
                for arm in ARMS:
                    # on the CPU: the MoE implementation has no CUDA path (yet)
                    out.append(('moe-E4k2-%s-%s-lr%s-s1' % (opt, arm, lr),
                                ['optim.name=' + opt, 'optim.lr=' + lr] + MOE +
                                ['train.device=cpu'] + ARM_SETS[arm]))
    only = [x for x in os.environ.get('ONLY_OPT', '').split(',') if x]
    if only:
        out = [(n, sets) for n, sets in out if any(kv in sets for kv in
                                                    ('optim.name=' + o for o in only))]
    return out


PHASES = 'ABCDEFG'


def full_plan(runs):
    """Every planned run once (phase E's seed-2 cells of adamw and muon are phase C's when
    the best lr did not move)."""
    out, seen = [], set()
    for p in PHASES:
        for n, s in plan(p, runs):
            if n not in seen:
                seen.add(n)
                out.append((p, n, s))
    return out


# ---------------------------------------------------------------- results.csv

def write_results(runs, path):
    tmp = path + '.tmp'
    with open(tmp, 'w', newline='') as f:
        w = csv.writer(f, lineterminator='\n')
        w.writerow(COLUMNS)
        for r in runs:
            row = []
            for c in COLUMNS:
                v = r[c]
                if isinstance(v, float):
                    v = '' if math.isnan(v) else ('%.6g' % v if c not in ('final_train_loss', 'final_val_loss') else '%.4f' % v)
                row.append(v)
            w.writerow(row)
    os.replace(tmp, path)


# ---------------------------------------------------------------- plots

def plot(asyncpp, out, runs_labels, title, y='loss', smooth=0.0, ymax=None, x='step'):
    runs_labels = [(r, l) for r, l in runs_labels if r]
    if not runs_labels:
        return None
    cmd = [asyncpp, 'plot', '--force', '-o', out, '--x', x, '--y', y, '--title', title]
    if smooth:
        cmd += ['--smooth', str(smooth)]
    if ymax is not None:
        cmd += ['--ymax', '%.3f' % ymax]
    for _, l in runs_labels:
        cmd += ['--label', l]
    cmd += [os.path.join(r['dir'], 'metrics.csv') for r, _ in runs_labels]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        print('report.py: asyncpp plot failed: ' + res.stderr.strip(), file=sys.stderr)
        return None
    return out


def zoom(rs, margin=1.2):
    """A y limit that leaves out the first steps: the highest final train loss + margin."""
    v = [r['final_train_loss'] for r in rs if r and not math.isnan(r['final_train_loss'])]
    return max(v) + margin if v else None


# ---------------------------------------------------------------- the report

def f4(v):
    return '—' if v is None or (isinstance(v, float) and math.isnan(v)) else '%.4f' % v


def fsigned(v):
    return '—' if v is None or math.isnan(v) else '%+.4f' % v


def pct(v):
    return '—' if v is None or math.isnan(v) else '%.0f%%' % (100 * v)


def val(r):
    return r['final_val_loss'] if r else math.nan


def mean_or_nan(v):
    v = [x for x in v if not math.isnan(x)]
    return statistics.fmean(v) if v else math.nan


# ---------------------------------------------------------------- phases E-G in the report

# CPU seconds per training step of a grid run (one thread, 4 layers, 16 x 128 tokens,
# eval every 50 steps and start-up included), measured on this machine (2 shared cores) for
# the time estimate until finished runs give their own (100-step sync runs one at a time).
# MoE: the factor over the dense step (4 experts, top-2, experts half the dense width).
MEASURED_CPU_PER_STEP = {'adamw': 0.271, 'muon': 0.298, 'lion': 0.275, 'sgd': 0.327,
                         'adan': 0.341, 'mars': 0.271, 'ademamix': 0.288, 'soap': 0.415,
                         'normuon': 0.310}
MOE_COST = 1.08
MEASURED_NOTE = ('100-step sync runs one at a time on an otherwise idle core, code of commit '
                 '9274108 (AdamW\'s async, async + EF and async + predict arms cost within 3%% '
                 'of its sync arm; the MoE step %.2f× the dense one, AdamW and Muon, with the '
                 'code of the MoE merge, f073931)' % MOE_COST)


def vv(r):
    """Final val loss for a verdict: a diverged run counts as infinitely bad, a missing one
    is NaN (not yet run)."""
    if not r:
        return math.nan
    if r['status'] == 'diverged':
        return math.inf
    return r['final_val_loss']


def fx(v, fmt='%.4f'):
    if v is None or math.isnan(v):
        return '—'
    if math.isinf(v):
        return 'div.'
    return fmt % v


def fgap(v):
    return fx(v, '%+.4f')


def seed2_of(runs, r):
    if not r:
        return None
    s2 = [x for x in find(runs, optimizer=r['optimizer'], arm=r['arm'], lr=r['lr'], seed=2)
          if is_base(x)]
    return s2[0] if s2 else None


def measured_class(g1, g2, ga):
    """The group a pair of per-seed gaps falls in, by the rules (ga: AdamW's mean gap)."""
    gm = (g1 + g2) / 2
    if gm < RULE_Y and g1 < RULE_Y and g2 < RULE_Y:
        return 'robust'
    if g1 > 0 and g2 > 0 and gm > RULE_X and gm >= RULE_R * ga:
        return 'degrades'
    if g1 > 0 and g2 > 0 and gm >= RULE_Y:
        return 'in between'
    return 'unclear'


def verdict(ok):
    return '**holds**' if ok else '**does not hold**'


def rules_text():
    """The decision rules, fixed before the runs of phases E-G (report.py's RULE_*)."""
    return [
        'Fixed in `report.py` (`RULE_X`, `RULE_Y`, `RULE_N`, `RULE_Z`, `RULE_R`) and committed '
        'before any run of phases E–G; they are not changed after seeing results. A *gap* is a '
        'final val loss difference in nats, async arm minus sync arm, each arm at its own best '
        'learning rate of the 4-arm grid (seed 1); seed 2 reruns each arm at that lr, and a '
        '*per-seed gap* is computed within one seed. A diverged run counts as an infinite '
        'loss. Where a rule needs a run that has not finished, the verdict is *not yet run*.',
        '',
        '1. **Measured group** of an optimizer, from its per-seed gaps g1, g2 and their mean g:',
        '   - *robust*: g < Y = %.2f and g1, g2 < Y;' % RULE_Y,
        '   - *degrades*: g > X = %.2f, g1 > 0 and g2 > 0 (both seeds agree in sign), and g ≥ '
        '%.2f × AdamW\'s mean gap (it degrades *like AdamW*);' % (RULE_X, RULE_R),
        '   - *in between*: g1 > 0, g2 > 0, g ≥ Y and not *degrades*;',
        '   - *unclear*: none of these (the seeds disagree).',
        '   The paper\'s grouping **holds** for an optimizer when its measured group is the '
        'paper\'s group (AdamW, MARS: degrades; Lion, SOAP, Adan: in between; Muon, NorMuon: '
        'robust). AdEMAMix and SGD are not placed by the paper: measured, no verdict.',
        '2. **The order** (scale-free): the mean gap of each paper group, averaged over its '
        'optimizers, rises from *robust* to *in between* to *degrades*, each step by more '
        'than N = %.2f nats (twice the largest seed spread of grid C, 0.0142).' % RULE_N,
        '3. **EF closes the gap** (paper: 50–90%% recovered): for an optimizer whose mean gap '
        'exceeds N, async+EF − sync ≤ Z = %.0f%% of async − sync in both seeds. A mean gap '
        'of N or less leaves *nothing to close*. Weight prediction (async + predict) is '
        'measured with the same test; the paper makes no claim about it.' % (100 * RULE_Z),
        '4. **Long horizon** (phase F, %d tokens per parameter, one seed, every arm at the '
        'optimizer\'s best sync lr): (a) Muon\'s gap *shrinks*: its gap at the end of the long '
        'run is below its gap at the same lr in the %s-step grid by more than N; (b) it '
        '*reaches the robust level*: the long gap is below Y (paper: 0.012); (c) AdamW '
        'still degrades more: AdamW\'s long gap exceeds twice Muon\'s and Muon\'s by more '
        'than N (paper: > 0.2 against 0.012); (d) EF closes Muon\'s long gap: as rule 3, '
        'one seed (paper: 2.590 → 2.583 against sync 2.578, 58%%).'
        % (TPP, os.environ.get('STEPS', '300')),
        '5. **MoE** (phase G, one seed, every arm at the optimizer\'s best dense sync lr): '
        '(a) Muon is robust in the MoE: gap < Y (paper, 10B MoE: 1.906 → 1.911, 0.005); '
        '(b) AdamW\'s MoE gap exceeds Muon\'s by more than N; (c) EF closes Muon\'s MoE gap '
        'as rule 3, one seed (paper: back to 1.906, 100%).',
    ]


def write_gap_csv(path, pairs):
    """pairs: [(step, tokens, value)] -> a metrics-like CSV that asyncpp plot reads."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + '.tmp', 'w') as f:
        f.write('step,tokens,val_loss\n')
        for s, t, v in pairs:
            f.write('%d,%d,%.6f\n' % (s, t, v))
    os.replace(path + '.tmp', path)


def val_by_step(r):
    """{step: (val loss, tokens)} of a run's evaluations (the last row of a step wins)."""
    steps = {}
    with open(os.path.join(r['dir'], 'metrics.csv'), newline='') as f:
        for row in csv.DictReader(f):
            if row.get('val_loss'):
                steps[int(float(row['step']))] = (float(row['val_loss']),
                                                  float(row.get('tokens') or 0))
    return steps


def shard_tokens(runs):
    """Tokens in the grids' training shard (asyncpp inspect), 0 if unknown."""
    for r in runs:
        if is_base(r):
            path = read_config(os.path.join(r['dir'], 'config.ini'))['data']['train']
            res = subprocess.run([ASYNCPP, 'inspect', path], capture_output=True, text=True)
            m = re.search(r'^\s*tokens\s+(\d+)', res.stdout, re.M)
            return int(m.group(1)) if res.returncode == 0 and m else 0
    return 0


def cpu_per_step(runs, opt):
    """CPU seconds per grid step of an optimizer: the median of its finished grid runs (of
    100 steps or more: start-up weighs on shorter ones), or the measured constant before
    any."""
    xs = [r['cpu_s'] / r['steps'] for r in runs if is_base(r) and r['optimizer'] == opt and
          r['status'] == 'ok' and r['steps'] >= 100 and not math.isnan(r['cpu_s'])]
    if xs:
        return statistics.median(xs), True
    return MEASURED_CPU_PER_STEP.get(opt, math.nan), False


def estimate(runs, have):
    """[(phase, what, runs, CPU seconds)] of the runs of phases E-G not finished yet: the
    ones planned now and, for the parts planned only later, a projection."""
    steps = int(os.environ.get('STEPS', '300'))
    rows = []
    planned = {p: [(n, s) for q, n, s in full_plan(runs) if q == p] for p in 'EFG'}

    def cost(sets, n_steps):
        opt = [kv.split('=', 1)[1] for kv in sets if kv.startswith('optim.name=')][0]
        c = cpu_per_step(runs, opt)[0] * n_steps
        return c * MOE_COST if any(kv.startswith('model.n_expert=') for kv in sets) else c

    def steps_of(sets):
        t = [int(kv.split('=', 1)[1]) for kv in sets if kv.startswith('train.steps=')]
        return t[0] if t else steps

    ad = [(n, s) for q, n, s in full_plan(runs) if q in 'ABCD']
    early = [(n, s) for n, s in ad if n not in have]
    if early:
        rows.append(('A–D', 'planned now, not finished (E compares against them)', len(early),
                     sum(cost(s, steps_of(s)) for _, s in early)))
    rest = 74 - len(ad)  # the runs A-D plan only from their own results (74 in all before)
    if rest > 0:
        rate = statistics.fmean(cpu_per_step(runs, o)[0] for o in OPTIMIZERS)
        rows.append(('A–D', 'projected: the rest of the 74 runs they made before '
                     '(extensions, seeds, momentum, 8 layers)', rest, rest * steps * rate * 1.2))
    for p in 'EFG':
        todo = [(n, s) for n, s in planned[p] if n not in have]
        if todo:
            rows.append((p, 'planned now, not finished', len(todo),
                         sum(cost(s, steps_of(s)) for _, s in todo)))
    # E: parts that are planned only once the base grid (extension) or the whole grid
    # (seed 2) of an optimizer has finished
    ext_n = ext_c = seed_n = seed_c = 0.0
    for opt in ALL_OPTIMIZERS:
        c = cpu_per_step(runs, opt)[0] * steps
        if extension_or_none(runs, opt, ARMS4) is None and opt in NEW_OPTIMIZERS:
            ext_n += 4  # assumed: one lr past one end, 4 arms (as 3 of the 4 grids of A-D)
            ext_c += 4 * c
        if extension_or_none(runs, opt) is None and opt in OPTIMIZERS:
            ext_n += 1  # the predict arm at the lr phase B or D adds (assumed: one)
            ext_c += c
        if not grid4_done(runs, opt):
            n = 1 if opt in HEADLINE else 4  # adamw's and muon's other three are phase C's
            seed_n += n
            seed_c += n * c
    if ext_n:
        rows.append(('E', 'grid extension, projected (one lr x 4 arms per new optimizer; '
                     'async + predict at one lr of phase B\'s or D\'s extension per old one)',
                     int(ext_n), ext_c))
    if seed_n:
        rows.append(('E', 'seed 2 at the best lrs, projected', int(seed_n), seed_c))
    if not planned['F']:
        T = long_steps(runs) or int(math.ceil(TPP * 1377408 / 2048))
        n = sum(len(long_arms(o)) for o in HEADLINE)
        rows.append(('F', 'long horizon, projected (%d steps each)' % T, n,
                     sum(len(long_arms(o)) * cpu_per_step(runs, o)[0] * T for o in HEADLINE)))
    if not planned['G'] and moe_supported():
        rows.append(('G', 'MoE, projected', 2 * len(ARMS),
                     sum(len(ARMS) * cpu_per_step(runs, o)[0] * steps * MOE_COST
                         for o in HEADLINE)))
    return rows


def new_sections(runs, P, asyncpp, work, add):
    """Sections 5-8 (phases E-G) and the rules; returns the verdict lines for the summary."""
    have = {r['name'] for r in runs}
    summary = []  # (finding, paper, measured, verdict)

    # ---- rules
    add('## 5. Decision rules for phases E–G (fixed before the runs)')
    add('')
    for line in rules_text():
        add(line)
    add('')

    # ---- grouping
    add('## 6. The paper\'s grouping: nine optimizers, four arms (phase E)')
    add('')
    add('Final val loss at each arm\'s best lr of the 4-arm grid, mean of seeds 1 and 2 (seed '
        '1 alone, marked ¹, while seed 2 has not run). *async + predict* runs the gradient on '
        'the weights extrapolated by the delay (`optim.correction=predict`). *Gap* = async − '
        'sync, then the two seeds\' own gaps in brackets; *EF* and *predict* give the share of '
        'the gap each closes, (async − corrected) / (async − sync). Verdicts by rules 1 and '
        '3 of section 5.')
    add('')
    add('| optimizer | paper\'s group | sync | async | async + EF | async + predict | gap (seed 1 / 2) '
        '| measured group | grouping | EF closes | predict closes |')
    add('|---|---|---|---|---|---|---|---|---|---|---|')
    gaps = {}
    info = {}
    for opt in ALL_OPTIMIZERS:
        b1 = {arm: best4(runs, opt, arm) for arm in ARMS4}
        b2 = {arm: seed2_of(runs, b1[arm]) for arm in ARMS4}
        v1 = {arm: vv(b1[arm]) for arm in ARMS4}
        v2 = {arm: vv(b2[arm]) for arm in ARMS4}
        info[opt] = (b1, b2, v1, v2)
        g1 = v1['async'] - v1['sync']
        g2 = v2['async'] - v2['sync']
        gaps[opt] = (g1, g2, (g1 + g2) / 2)
    ga = gaps['adamw'][2]
    classes = {}
    for opt in ALL_OPTIMIZERS:
        b1, b2, v1, v2 = info[opt]
        g1, g2, gm = gaps[opt]

        def cell(arm):
            a, b = v1[arm], v2[arm]
            if math.isnan(b):
                return fx(a) + ('¹' if not math.isnan(a) else '')
            return fx((a + b) / 2) if math.isfinite(a) and math.isfinite(b) else 'div.'
        group = PAPER_GROUP.get(opt)
        if math.isnan(gm) or math.isnan(ga):
            cls, gv = '—', 'not yet run'
        else:
            cls = measured_class(g1, g2, ga)
            gv = verdict(cls == group) if group else 'no claim'
        classes[opt] = cls

        def closes(arm):
            c1, c2 = v1[arm] - v1['sync'], v2[arm] - v2['sync']
            if any(math.isnan(x) for x in (c1, c2, g1, g2)):
                return 'not yet run', None
            if not gm > RULE_N:
                return 'nothing to close', None
            share = 1 - ((c1 + c2) / 2) / gm if math.isfinite(c1 + c2) and math.isfinite(gm) \
                else math.nan
            ok = c1 <= RULE_Z * g1 and c2 <= RULE_Z * g2
            return '%s (rule 3: %s)' % (pct(share), 'yes' if ok else 'no'), ok
        ef, efok = closes('async-ef')
        pr, _ = closes('async-predict')
        if efok is not None:
            ef = ef.replace('(rule 3: yes)', '— **holds**').replace('(rule 3: no)',
                                                                      '— **does not hold**')
        add('| %s | %s | %s | %s | %s | %s | %s (%s / %s) | %s | %s | %s | %s |' % (
            opt, group or 'not placed', cell('sync'), cell('async'), cell('async-ef'),
            cell('async-predict'), fgap(gm), fgap(g1), fgap(g2), cls, gv, ef, pr))
        if group:
            summary.append(('%s: %s' % (opt, group),
                            {'adamw': 'gap > 0.2 (360M)', 'muon': 'gap 0.012 (360M)'}.get(
                                opt, group + ' (paper\'s figure)'),
                            'gap %s, measured %s' % (fgap(gm), cls), gv))
        if efok is not None:
            summary.append(('%s: EF closes the gap' % opt, '50–90% recovered',
                            ef.split(' — ')[0] + ' recovered', verdict(efok)))
        elif 'nothing' in ef:
            summary.append(('%s: EF closes the gap' % opt, '50–90% recovered',
                            'gap ≤ N', 'nothing to close'))
    add('')
    add('AdamW\'s mean gap (the reference of *degrades*): %s; X = %.2f, Y = %.2f, N = %.2f, '
        'Z = %.0f%%, R = %.2f.' % (fgap(ga), RULE_X, RULE_Y, RULE_N, 100 * RULE_Z, RULE_R))
    add('')
    # the order
    means = {}
    for grp in GROUP_ORDER:
        xs = [gaps[o][2] for o in ALL_OPTIMIZERS if PAPER_GROUP.get(o) == grp]
        means[grp] = statistics.fmean(xs) if xs and not any(math.isnan(x) for x in xs) \
            else math.nan
    if any(math.isnan(means[g]) for g in GROUP_ORDER):
        ov = 'not yet run'
    else:
        ov = verdict(means['in between'] - means['robust'] > RULE_N and
                     means['degrades'] - means['in between'] > RULE_N)
    add('The order (rule 2): mean gap of the robust group %s, in between %s, degrades %s: '
        '%s.' % (fgap(means['robust']), fgap(means['in between']), fgap(means['degrades']), ov))
    add('')
    summary.append(('the order robust < in between < degrades', 'Muon, NorMuon < Lion, SOAP, '
                    'Adan < AdamW, MARS', ' < '.join(fgap(means[g]) for g in GROUP_ORDER), ov))
    # the lr grid of phase E
    add('The 4-arm grid (seed 1, final val loss; for adamw, muon, lion and sgd the first three '
        'arms are phases A–D\'s runs):')
    add('')
    add('| optimizer | lr | sync | async | async + EF | async + predict |')
    add('|---|---|---|---|---|---|')
    for opt in ALL_OPTIMIZERS:
        for lr in grid4(runs, opt):
            cells = []
            for arm in ARMS4:
                rr = base_runs(runs, opt, arm, [lr])
                cells.append(fx(vv(rr[0])) if rr else '—')
            add('| %s | %s | %s |' % (opt, lr, ' | '.join(cells)))
    add('')
    add('Base grids: %s; the extension rule of phases B and D over the four arms adds one lr '
        'past an end where any arm\'s best sits (for all arms): %s.' % (
            '; '.join('%s %s' % (o, ', '.join(LRS[o])) for o in NEW_OPTIMIZERS),
            '; '.join('%s + %s' % (o, ', '.join(extension(runs, o, ARMS4)))
                      for o in ALL_OPTIMIZERS if extension(runs, o, ARMS4)) or 'none so far'))
    add('')
    codes = sorted({info[o][0][a]['code'] or '(not recorded)' for o in ALL_OPTIMIZERS
                    for a in ARMS4 if info[o][0][a]})
    if len(codes) > 1:
        add('**Made by more than one code version** (%s): cells compared across versions '
            'differ in their last bits (see [Reproducing](#reproducing-these-numbers)).'
            % ', '.join(codes))
        add('')
    for opt in ALL_OPTIMIZERS:
        b1 = info[opt][0]
        rl = [(b1[arm], '%s (lr %s)' % (ARM_NAMES[arm], fmt_lr(b1[arm]['lr'])) if b1[arm]
               else '') for arm in ARMS4]
        out = plot(asyncpp, os.path.join(P, 'arms4-%s.svg' % opt), rl,
                   '%s: train loss, best lr of each arm (seed 1)' % opt, smooth=0.9,
                   ymax=zoom([x for x, _ in rl]))
        if out:
            add('![%s, four arms](plots/arms4-%s.svg)' % (opt, opt))
            add('')

    # ---- long horizon
    T = long_steps(runs)
    shape = grid_shape(runs)
    add('## 7. The long horizon: %d tokens per parameter (phase F)' % TPP)
    add('')
    longs = {}
    for opt in HEADLINE:
        for arm in long_arms(opt):
            rs = [r for r in runs if r['name'].startswith('long-%s-%s-lr' % (opt, arm)) and
                  (not T or r['steps'] == T)]
            longs[(opt, arm)] = rs[0] if rs else None
    if shape:
        ntrain = shard_tokens(runs)
        add('The grid\'s model (%s parameters) trained for %s steps of %d tokens (%.1f M tokens, '
            '%.1f tokens per parameter%s), at the optimizer\'s best sync lr of the 4-arm grid, '
            'with the same warm-up and cosine decay stretched over the run; val loss every '
            '%d steps. One seed. The KJV is small: the long runs repeat it, which the paper\'s '
            'runs on FineWeb-Edu never do, so overfitting may enter the val loss.'
            % ('{:,}'.format(shape[0]), '{:,}'.format(T), shape[1], T * shape[1] / 1e6,
               T * shape[1] / shape[0],
               '; the training shard holds %s tokens, so a run passes over it %.1f times'
               % ('{:,}'.format(ntrain), T * shape[1] / ntrain) if ntrain else '',
               max(5, T // 50)))
    else:
        add('Planned once a grid run gives the parameter count.')
    add('')
    add('| optimizer | lr | sync | async | async + EF | long gap | gap at the grid\'s %s steps, '
        'same lr | paper (360M, 20 tok/param) |' % os.environ.get('STEPS', '300'))
    add('|---|---|---|---|---|---|---|---|')
    lg, sg = {}, {}
    for opt in HEADLINE:
        r = {arm: longs.get((opt, arm)) for arm in ARMS}
        lr = next((x['lr'] for x in r.values() if x), None)
        lg[opt] = vv(r['async']) - vv(r['sync'])
        if lr is not None:
            ss = base_runs(runs, opt, 'sync', [fmt_lr(lr)])
            aa = base_runs(runs, opt, 'async', [fmt_lr(lr)])
            sg[opt] = vv(aa[0]) - vv(ss[0]) if ss and aa else math.nan
        else:
            sg[opt] = math.nan
        add('| %s | %s | %s | %s | %s | %s | %s | %s |' % (
            opt, fmt_lr(lr) if lr else '—', fx(vv(r['sync'])), fx(vv(r['async'])),
            fx(vv(r['async-ef'])) if opt == 'muon' else '(not run)', fgap(lg[opt]),
            fgap(sg[opt]), {'adamw': 'gap > 0.2', 'muon': '2.578 / 2.590 / 2.583, gap 0.012'}[opt]))
    add('')
    m_l, m_s, a_l = lg['muon'], sg['muon'], lg['adamw']
    rs_m = {arm: longs.get(('muon', arm)) for arm in long_arms('muon')}
    fa = 'not yet run' if math.isnan(m_l) or math.isnan(m_s) else verdict(m_l < m_s - RULE_N)
    fb = 'not yet run' if math.isnan(m_l) else verdict(m_l < RULE_Y)
    fc = 'not yet run' if math.isnan(m_l) or math.isnan(a_l) else \
        verdict(a_l > 2 * max(m_l, 0) and a_l - m_l > RULE_N)
    e_l = vv(rs_m['async-ef']) - vv(rs_m['sync'])
    if math.isnan(m_l) or math.isnan(e_l):
        fd, fd_m = 'not yet run', '—'
    elif not m_l > RULE_N:
        fd, fd_m = 'nothing to close', 'gap %s ≤ N' % fgap(m_l)
    else:
        fd, fd_m = verdict(e_l <= RULE_Z * m_l), '%s recovered' % pct(1 - e_l / m_l)
    add('Rule 4: (a) Muon\'s gap shrinks with the horizon: %s (%s at %s steps against %s at '
        '%s steps); (b) it reaches the robust level (< Y): %s; (c) AdamW still degrades '
        'more: %s (AdamW %s); (d) EF closes Muon\'s long gap: %s (%s).' % (
            fa, fgap(m_l), T or '—', fgap(m_s), os.environ.get('STEPS', '300'), fb, fc,
            fgap(a_l), fd, fd_m))
    add('')
    # Not a decision rule (added after the first long runs, 2026-11-27): the
    # long runs pass over the small KJV ~28 times, so a run's last val loss
    # may sit above its lowest; the lowest points say how much of a long gap
    # is overfitting rather than the delay.
    lows = []
    for opt in HEADLINE:
        for arm in long_arms(opt):
            r = longs.get((opt, arm))
            if not r or r['status'] != 'ok':
                continue
            vs = val_by_step(r)
            if vs:
                step = min(vs, key=lambda k: (vs[k][0], k))
                lows.append((opt, arm, vs[max(vs)][0], vs[step][0], step))
    if lows:
        add('Not a decision rule (added after the first long runs): each long run\'s last and '
            'lowest val loss. Where the last sits well above the lowest, the run overfits the '
            'repeated KJV, and the long gap measures that as much as the delay.')
        add('')
        add('| optimizer | arm | last val loss | lowest | at step | rise since |')
        add('|---|---|---|---|---|---|')
        for opt, arm, last, low, step in lows:
            add('| %s | %s | %s | %s | %s | %s |' % (opt, arm, fx(last), fx(low),
                                                   '{:,}'.format(step), fgap(last - low)))
        add('')
        lowgap = []
        for opt in HEADLINE:
            d = {arm: low for o, arm, _, low, _ in lows if o == opt}
            if 'sync' in d and 'async' in d:
                lowgap.append('%s %s' % (opt, fgap(d['async'] - d['sync'])))
        if lowgap:
            add('The gap between the lowest points (async minus sync): %s.' % ', '.join(lowgap))
            add('')
    summary += [('long horizon: Muon\'s gap shrinks', 'gap 0.012 at 20 tok/param',
                 '%s → %s' % (fgap(m_s), fgap(m_l)), fa),
                ('long horizon: Muon robust (gap < Y)', '0.012', fgap(m_l), fb),
                ('long horizon: AdamW degrades more', '> 0.2 against 0.012',
                 '%s against %s' % (fgap(a_l), fgap(m_l)), fc),
                ('long horizon: EF closes Muon\'s gap', '58% (2.590 → 2.583)', fd_m, fd)]
    # gap against tokens: the evaluations both arms share, and the paper's two figures
    lines = []
    for opt, arm in [('adamw', 'async'), ('muon', 'async'), ('muon', 'async-ef')]:
        s, a = longs.get((opt, 'sync')), longs.get((opt, arm))
        if not s or not a or s['status'] != 'ok':
            continue
        vs, va = val_by_step(s), val_by_step(a)
        pts = [(st, vs[st][1], va[st][0] - vs[st][0]) for st in sorted(vs) if st in va]
        if len(pts) >= 2:
            path = os.path.join(work, 'derived', 'gap-%s-%s.csv' % (opt, arm))
            write_gap_csv(path, pts)
            lines.append((path, '%s: %s − sync' % (opt, ARM_NAMES[arm])))
    if lines:
        with open(lines[0][0]) as f:
            rows = list(csv.DictReader(f))
        t0, t1 = int(rows[0]['tokens']), int(rows[-1]['tokens'])
        for v, lab in [(0.2, 'paper: AdamW gap > 0.2 (360M)'),
                       (0.012, 'paper: Muon gap 0.012 (360M)')]:
            path = os.path.join(work, 'derived', 'paper-%g.csv' % v)
            write_gap_csv(path, [(0, t0, v), (1, t1, v)])
            lines.append((path, lab))
        cmd = [asyncpp, 'plot', '--force', '-o', os.path.join(P, 'long-gap.svg'), '--x', 'tokens',
               '--y', 'val_loss', '--title',
               'val loss gap to sync against tokens (%d tokens/parameter at the end)' % TPP]
        for _, lab in lines:
            cmd += ['--label', lab]
        cmd += [p for p, _ in lines]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode == 0:
            add('The gap against tokens, from the evaluations along the long runs (y: val loss '
                'of the async arm minus the sync arm\'s at the same step; the flat lines are '
                'the paper\'s figures at 360M). Along one run the lr has not yet decayed, so '
                'a point mid-run is not what a run of that length would end at; the table\'s '
                'two horizons are both fully decayed.')
            add('')
            add('![gap against tokens](plots/long-gap.svg)')
            add('')
        else:
            print('report.py: asyncpp plot failed: ' + res.stderr.strip(), file=sys.stderr)
    rl = [(longs.get((o, a)), '%s %s' % (o, ARM_NAMES[a])) for o in HEADLINE
          for a in long_arms(o)]
    if plot(asyncpp, os.path.join(P, 'long-val.svg'), rl,
            'long horizon: val loss against tokens', y='val_loss', x='tokens',
            ymax=zoom([x for x, _ in rl], 1.0)):
        add('![long horizon val loss](plots/long-val.svg)')
        add('')

    # ---- MoE
    add('## 8. A mixture of experts (phase G)')
    add('')
    moe = {}
    for opt in HEADLINE:
        for arm in ARMS:
            rs = [r for r in runs if r['n_expert'] > 0 and r['optimizer'] == opt and
                  r['arm'] == arm and r['seed'] == 1]
            moe[(opt, arm)] = rs[0] if rs else None
    if not moe_supported() and not any(moe.values()):
        add('**Skipped**: this binary (`%s`) does not know `model.n_expert`; the MoE '
            'implementation is merged apart. Once it is, `experiments/run.sh phase G` runs the '
            'cell and this section fills in.' % os.path.basename(asyncpp))
        add('')
        summary += [('MoE: Muon robust', '1.906 → 1.911 (10B)', '—', 'skipped (no MoE in the binary)'),
                    ('MoE: AdamW degrades more than Muon', '—', '—', 'skipped'),
                    ('MoE: EF closes Muon\'s gap', '1.911 → 1.906', '—', 'skipped')]
    else:
        add('The 4-layer llama with each feed-forward replaced by %s (`%s`): the same active '
            'FLOPs per token as the dense model, twice its feed-forward parameters; '
            'everything else as the grid, each optimizer at its best dense sync lr, one seed, '
            'on the CPU. The paper\'s 10B MoE: sync 1.906, async 1.911, async + correction '
            '1.906.' % ('4 experts of half the width, top-2 routing', ' '.join(MOE)))
        add('')
        add('| optimizer | lr | sync | async | async + EF | gap | EF closes |')
        add('|---|---|---|---|---|---|---|')
        mg, me = {}, {}
        for opt in HEADLINE:
            r = {arm: moe[(opt, arm)] for arm in ARMS}
            lr = next((x['lr'] for x in r.values() if x), None)
            mg[opt] = vv(r['async']) - vv(r['sync'])
            me[opt] = vv(r['async-ef']) - vv(r['sync'])
            share = 1 - me[opt] / mg[opt] if mg[opt] > 0 else math.nan
            add('| %s | %s | %s | %s | %s | %s | %s |' % (
                opt, fmt_lr(lr) if lr else '—', fx(vv(r['sync'])), fx(vv(r['async'])),
                fx(vv(r['async-ef'])), fgap(mg[opt]), pct(share)))
        add('')
        m, a = mg['muon'], mg['adamw']
        ga_ = 'not yet run' if math.isnan(m) else verdict(m < RULE_Y)
        gb_ = 'not yet run' if math.isnan(m) or math.isnan(a) else verdict(a > m + RULE_N)
        if math.isnan(m) or math.isnan(me['muon']):
            gc_, gc_m = 'not yet run', '—'
        elif not m > RULE_N:
            gc_, gc_m = 'nothing to close', 'gap ≤ N'
        else:
            gc_, gc_m = verdict(me['muon'] <= RULE_Z * m), '%s recovered' % pct(1 - me['muon'] / m)
        add('Rule 5: (a) Muon is robust in the MoE: %s (gap %s); (b) AdamW\'s MoE gap exceeds '
            'Muon\'s by more than N: %s (%s against %s); (c) EF closes Muon\'s MoE gap: %s (%s).'
            % (ga_, fgap(m), gb_, fgap(a), fgap(m), gc_, gc_m))
        add('')
        summary += [('MoE: Muon robust', 'gap 0.005 (1.906 → 1.911, 10B)', fgap(m), ga_),
                    ('MoE: AdamW degrades more than Muon', '—', '%s against %s' % (fgap(a), fgap(m)), gb_),
                    ('MoE: EF closes Muon\'s gap', '100% (1.911 → 1.906)', gc_m, gc_)]
        rl = [(moe[(o, a)], '%s %s' % (o, ARM_NAMES[a])) for o in HEADLINE for a in ARMS]
        if plot(asyncpp, os.path.join(P, 'moe.svg'), rl, 'MoE: train loss, sync / async / '
                'async + EF', smooth=0.9, ymax=zoom([x for x, _ in rl])):
            add('![MoE train loss](plots/moe.svg)')
            add('')

    # ---- summary
    add('## 9. Phases E–G next to the paper')
    add('')
    add('Every verdict of sections 6–8 in one table, beside the paper\'s figure (360M dense '
        'at 20 tokens per parameter, 10B MoE); the rules are section 5\'s.')
    add('')
    add('| finding | paper | measured here | verdict |')
    add('|---|---|---|---|')
    for f, p_, m_, v_ in summary:
        add('| %s | %s | %s | %s |' % (f, p_, m_, v_))
    add('')
    add('The constant against variable delay at S = 8 is phase C\'s (section 4): it was not '
        'missing. Lion\'s and SGD\'s seed 2 are among phase E\'s seed-2 cells.')
    add('')

    # ---- cost
    add('## 10. Running phases E–G: what is left and how long it takes')
    add('')
    add('From the repository root:')
    add('')
    add('    experiments/run.sh')
    add('')
    add('runs every missing cell of phases A–G in order (A–D first where their runs are '
        'missing: E compares against them) and rewrites this report after each phase; '
        '`experiments/run.sh phase E` (or F, G) runs one phase; `experiments/run.sh status` '
        'counts. A finished run is never run again; a run cut off half-way continues from '
        'its last checkpoint when its configuration is unchanged (the long runs write one '
        'every 500 steps), else starts over.')
    add('')
    rows = estimate(runs, have)
    if rows:
        add('| phase | runs | count | CPU-hours |')
        add('|---|---|---|---|')
        for p_, what, n, c in rows:
            add('| %s | %s | %d | %.1f |' % (p_, what, n, c / 3600))
        tot = sum(c for *_, c in rows)
        add('| all | | %d | %.1f |' % (sum(n for _, _, n, _ in rows), tot / 3600))
        add('')
        meas = [o for o in ALL_OPTIMIZERS if not cpu_per_step(runs, o)[1]]
        eg = sum(c for p_, *_, c in rows if p_ in 'EFG')
        T = long_steps(runs) or int(math.ceil(TPP * 1377408 / 2048))
        long1 = max(T * cpu_per_step(runs, o)[0] for o in HEADLINE)
        nlong = sum(len(long_arms(o)) for o in HEADLINE)
        add('CPU seconds per step: the median of each optimizer\'s finished grid runs%s. '
            'Elapsed time with `JOBS=2` on this machine\'s 2 cores: about the CPU time while '
            'other work shares them (phases A–D: 74 runs, 2.7 CPU-hours, about 2.6 hours '
            'elapsed), about half of it on 2 idle cores, but never less than phase F\'s '
            '%d long runs of up to %.1f CPU-hours each, two at a time (%d rounds, %.1f hours). '
            'So phases E–G take **about %.0f hours** here (%.0f on idle cores)%s. Phases A–D '
            'ran at 0.36–0.41 CPU seconds per step beside other work, with older code: at that '
            'rate count up to 1.4 times as much.%s'
            % ((', and for %s, measured before any: %s' % (', '.join(meas), MEASURED_NOTE))
               if meas else '', nlong, long1 / 3600, (nlong + 1) // 2,
               (nlong + 1) // 2 * long1 / 3600, eg / 3600,
               max(eg / 2, (nlong + 1) // 2 * long1) / 3600,
               ', and A–D, where missing, %.1f CPU-hours more' % ((tot - eg) / 3600)
               if tot > eg else '',
               '' if moe_supported() else ' Phase G is not counted: this binary has no MoE.'))
    else:
        add('Nothing is left: every run of phases E–G has finished.')
    add('')
    return summary


def build_report(runs, exp, asyncpp, work):
    P = os.path.join(exp, 'plots')
    os.makedirs(P, exist_ok=True)
    L = []
    add = L.append
    planned = full_plan(runs)
    have = {r['name'] for r in runs}
    missing = [(p, n) for p, n, _ in planned if n not in have]
    failed_or_pending_B = not any(p == 'C' and n.endswith('-s2') for p, n, _ in planned)

    base_cfg = None
    for r in runs:
        if is_base(r):
            base_cfg = r
            break
    steps = base_cfg['steps'] if base_cfg else 0
    tokens = base_cfg['tokens'] if base_cfg else 0

    add('# Small-scale reproduction: optimizers under a one-step delay, error feedback, '
        'constant against variable delay')
    add('')
    add('*Generated by `experiments/report.py` from `results.csv`; do not edit by hand.* '
        'Regenerate everything (data, every missing run, results, plots, this file) with')
    add('')
    add('    experiments/run.sh')
    add('')
    add('from the repository root (`experiments/run.sh report` only rebuilds results.csv, the '
        'plots and this file from the runs already finished). Runs are kept in '
        '`experiments/work/runs/` (not committed), and each finished run\'s configuration, '
        'metrics and status also in `experiments/archive/` (committed, restored into '
        '`work/runs/` by a fresh checkout); a finished run is never run again, so the '
        'script resumes where it stopped, on any machine.')
    add('')
    if missing:
        add('**The grid is not complete: %d of %d runs are missing** (listed under '
            '[Missing runs](#missing-runs)); `experiments/run.sh` runs them and rewrites '
            'this report.%s' % (len(missing), len(planned),
                                ' Phases B–D (grid extensions, seeds, momentum, depth) are planned once '
                                'phase A has results.' if failed_or_pending_B else ''))
        add('')

    add('## Setup')
    add('')
    add('- **Data**: the King James Bible from Debian\'s `bible-kjv` (`bible -f '
        '\'Gen1:1-Rev22:21\'`, verse references stripped, one document per chapter), '
        'asyncpp\'s own byte-level BPE with 4096 tokens trained on it, 5% of the chapters '
        'held out as the val shard (`asyncpp tokenize encode --val-fraction 0.05`).')
    if base_cfg:
        add('- **Model**: llama (RMSNorm, RoPE, SwiGLU, tied embeddings), %d layers, width %d, '
            '4 heads, context 128: 1.38 M parameters (2.23 M with 8 layers; the 4096 × 128 '
            'embedding is 0.52 M of them).'
            % (base_cfg['n_layer'], base_cfg['d_model']))
        add('- **Training**: %d steps of 16 × 128 tokens (%s tokens per run, the same for every '
            'run compared), warm-up 20 steps, cosine decay to 0.1 × lr, weight decay 0.1, '
            'gradient clipping at 1, on the CPU with one thread per run, two runs at a time. '
            'Muon is the hybrid: Newton–Schulz on the hidden matrices, AdamW on embeddings and '
            'norms, one lr (`optim.muon_scale=rms`). SGD uses Nesterov momentum 0.95.'
            % (steps, '{:,}'.format(int(tokens))))
    add('- **Arms**: *sync* is ordinary training; *async* is the 2BW one-step delay emulated '
        'on one worker (`train.delay=1`), which asyncpp\'s tests prove bit-identical to a real '
        '2BW pipeline (and [checked again below](#the-pipeline-equivalence)); *async + EF* adds '
        'the error-feedback correction (`optim.correction=ef`, λ = 1); *async + predict* '
        '(phases E–G) instead runs each gradient on the weights extrapolated by the delay, '
        '2w[t] − w[t−1] (`optim.correction=predict`).')
    add('- **Optimizers of phases E–G**: Adan, MARS (approximate MARS-AdamW), AdEMAMix, SOAP '
        'and NorMuon next to AdamW, Muon, Lion and SGD, each with its paper\'s betas and '
        'weight decay (the defaults `optim.name` selects, listed in asyncpp-train(1)); the '
        'matrix optimizers (Muon, NorMuon, MARS, SOAP) give embeddings and norms AdamW.')
    add('- **Final losses**: val loss is measured at the last step on 12 batches (24,576 '
        'tokens) of the held-out shard; train loss is the mean of the last 10 steps. The '
        'learning rate of each arm is the best of the same 3-value grid (best by final val '
        'loss); the seed is 1 unless a table says otherwise.')
    add('')

    # ---- table 1
    add('## 1. Optimizers under a one-step delay, and error feedback')
    add('')
    add('Final val loss at each arm\'s best learning rate. *Gap* = async − sync; *recovered* '
        '= (async − async+EF) / gap, the share of the gap that error feedback closes.')
    add('')
    add('| optimizer | sync | async | async + EF | gap | EF gap | recovered | best lr (sync / async / EF) |')
    add('|---|---|---|---|---|---|---|---|')
    headline = {}
    for opt in OPTIMIZERS:
        b = {arm: best_run(runs, opt, arm) for arm in ARMS}
        headline[opt] = b
        s, a, e = val(b['sync']), val(b['async']), val(b['async-ef'])
        gap, egap = a - s, e - s
        rec = (a - e) / gap if gap > 0 else math.nan
        def lr_cell(r):
            if not r:
                return '—'
            g = [float(x) for x in grid(runs, opt)]
            edge = abs(r['lr'] - g[0]) < 1e-12 or abs(r['lr'] - g[-1]) < 1e-12
            return fmt_lr(r['lr']) + ('*' if edge else '')
        lrs = ' / '.join(lr_cell(b[x]) for x in ARMS)
        add('| %s | %s | %s | %s | %s | %s | %s | %s |' % (opt, f4(s), f4(a), f4(e), fsigned(gap),
                                                      fsigned(egap), pct(rec), lrs))
    add('')
    add('The grid of each optimizer is %s. Where an arm\'s best lr sat at an end of that '
        'grid, the grid was extended by one value past that end for every arm of the '
        'optimizer (the same rule for every optimizer: the same grid for all arms, one '
        'step only; it was added once AdamW\'s async arm came out best at the low end): %s. A * marks a best lr still at an end of the (extended) grid: the optimum '
        'may lie beyond it.' % ('; '.join('%s %s' % (o, ', '.join(LRS[o])) for o in OPTIMIZERS),
                                '; '.join('%s + %s' % (o, ', '.join(extension(runs, o)))
                                          for o in OPTIMIZERS if extension(runs, o)) or
                                'none so far'))
    add('')
    add('The whole learning-rate grid (final val loss; *div.* = the loss became NaN or '
        'infinite and the run stopped):')
    add('')
    add('| optimizer | lr | sync | async | async + EF | gap at this lr |')
    add('|---|---|---|---|---|---|')
    for opt in OPTIMIZERS:
        for lr in grid(runs, opt):
            cells = []
            vals = {}
            for arm in ARMS:
                rr = [r for r in find(runs, optimizer=opt, arm=arm, lr=float(lr), seed=1)
                      if is_base(r)]
                if not rr:
                    cells.append('—')
                    vals[arm] = math.nan
                elif rr[0]['status'] == 'diverged':
                    cells.append('div.')
                    vals[arm] = math.inf
                else:
                    cells.append(f4(val(rr[0])))
                    vals[arm] = val(rr[0])
            g = vals['async'] - vals['sync']
            add('| %s | %s | %s | %s |' % (opt, lr, ' | '.join(cells),
                                          fsigned(g) if math.isfinite(g) else '—'))
    add('')

    # plots: train loss per optimizer
    for opt in OPTIMIZERS:
        b = headline[opt]
        rl = [(b[arm], '%s (lr %s)' % (ARM_NAMES[arm], fmt_lr(b[arm]['lr'])) if b[arm] else '')
              for arm in ARMS]
        out = plot(asyncpp, os.path.join(P, 'loss-%s.svg' % opt), rl,
                   '%s: train loss, best lr of each arm' % opt, smooth=0.9,
                   ymax=zoom([x for x, _ in rl]))
        if out:
            add('![%s train loss](plots/loss-%s.svg)' % (opt, opt))
            add('')
    rl = []
    for opt in HEADLINE:
        for arm in ARMS:
            r = headline[opt][arm]
            rl.append((r, '%s %s' % (opt, ARM_NAMES[arm])))
    out = plot(asyncpp, os.path.join(P, 'val-headline.svg'), rl,
               'val loss: AdamW and Muon, sync / async / async + EF', y='val_loss',
               ymax=zoom([x for x, _ in rl], 1.0))
    if out:
        add('![val loss, AdamW and Muon](plots/val-headline.svg)')
        add('')

    # ---- seeds
    add('## 2. Seeds: the spread of the headline cells')
    add('')
    add('The headline cells again with seed 2 (initialisation and data order), each at the '
        'best lr of seed 1. *Spread* is |seed 1 − seed 2|.')
    add('')
    add('| optimizer | arm | lr | seed 1 | seed 2 | mean | spread |')
    add('|---|---|---|---|---|---|---|')
    seedmean, spread = {}, {}
    for opt in HEADLINE:
        for arm in ARMS:
            b = headline[opt][arm]
            if not b:
                add('| %s | %s | — | — | — | — | — |' % (opt, ARM_NAMES[arm]))
                continue
            s2 = [r for r in find(runs, optimizer=opt, arm=arm, lr=b['lr'], seed=2)
                  if is_base(r)]
            v1, v2 = val(b), val(s2[0]) if s2 else math.nan
            m = (v1 + v2) / 2  # nan until both seeds are in
            sp = abs(v1 - v2) if not math.isnan(v2) else math.nan
            seedmean[(opt, arm)], spread[(opt, arm)] = m, sp
            add('| %s | %s | %s | %s | %s | %s | %s |' % (opt, ARM_NAMES[arm], fmt_lr(b['lr']),
                                                        f4(v1), f4(v2), f4(m), f4(sp)))
    add('')
    add('Over both seeds:')
    add('')
    add('| optimizer | gap (mean of seeds) | recovered (mean of seeds) | largest spread |')
    add('|---|---|---|---|')
    seedgap, seedrec = {}, {}
    for opt in HEADLINE:
        s, a, e = (seedmean.get((opt, x), math.nan) for x in ARMS)
        gap = a - s
        rec = (a - e) / gap if gap > 0 else math.nan
        sps = [spread.get((opt, x), math.nan) for x in ARMS]
        sps = [x for x in sps if not math.isnan(x)]
        seedgap[opt], seedrec[opt] = gap, rec
        add('| %s | %s | %s | %s |' % (opt, fsigned(gap), pct(rec), f4(max(sps)) if sps else '—'))
    add('')
    noise = max([x for x in spread.values() if not math.isnan(x)], default=math.nan)

    # ---- momentum
    add('## 3. Momentum under the delay')
    add('')
    add('AdamW\'s β1 and Muon\'s momentum μ in {0.9, 0.95, 0.98}, sync and async, at the '
        'optimizer\'s best sync lr (seed 1); everything else stays (AdamW\'s β2 is 0.95, so '
        'β1 = 0.98 exceeds it). The lr is not re-tuned per momentum.')
    add('')
    add('| optimizer | momentum | lr | sync | async | gap |')
    add('|---|---|---|---|---|---|')
    momgap = {}
    for opt in HEADLINE:
        bs = headline[opt]['sync']
        if not bs:
            continue
        key = MOMENTUM_KEY[opt]
        for mom in MOMENTA:
            vv = {}
            for arm in ['sync', 'async']:
                rr = [r for r in find(runs, optimizer=opt, arm=arm, lr=bs['lr'], seed=1)
                      if is_short(r) and r['n_layer'] == 4 and r['micro_batches'] == 1 and
                      abs(r[key] - float(mom)) < 1e-12]
                vv[arm] = val(rr[0]) if rr else math.nan
            g = vv['async'] - vv['sync']
            momgap[(opt, mom)] = g
            add('| %s | %s = %s | %s | %s | %s | %s |' % (opt, 'β1' if key == 'beta1' else 'μ',
                                                        mom, fmt_lr(bs['lr']), f4(vv['sync']),
                                                        f4(vv['async']), fsigned(g)))
        rl = []
        for mom in MOMENTA:
            for arm in ['sync', 'async']:
                rr = [r for r in find(runs, optimizer=opt, arm=arm, lr=bs['lr'], seed=1)
                      if is_short(r) and r['n_layer'] == 4 and r['micro_batches'] == 1 and
                      abs(r[key] - float(mom)) < 1e-12]
                rl.append((rr[0] if rr else None, '%s %s %s' % (arm, 'β1' if key == 'beta1'
                                                                else 'μ', mom)))
        plot(asyncpp, os.path.join(P, 'momentum-%s.svg' % opt), rl,
             '%s: momentum, sync and async (lr %s)' % (opt, fmt_lr(bs['lr'])), smooth=0.9,
             ymax=zoom([x for x, _ in rl]))
    add('')
    for opt in HEADLINE:
        if os.path.exists(os.path.join(P, 'momentum-%s.svg' % opt)):
            add('![%s momentum](plots/momentum-%s.svg)' % (opt, opt))
            add('')

    # ---- constant vs variable delay
    add('## 4. Constant against variable delay')
    add('')
    add('An 8-layer model (so that S = 8 stages have one layer each) at the optimizer\'s best '
        '4-layer sync lr. *2BW* is the constant delay of 1 on every layer (the same for any '
        'S); *PipeDream S* is the original PipeDream\'s per-stage delay S−1−s on stage s '
        '(`train.delay_mode=per-stage`, one micro-batch per step, which is what the real '
        '`pipedream` schedule computes). Cells are final val loss; the difference to sync is '
        'in brackets.')
    add('')
    add('| optimizer | sync | 2BW (delay 1) | PipeDream S=2 | PipeDream S=4 | PipeDream S=8 |')
    add('|---|---|---|---|---|---|')
    depth = {}
    for opt in HEADLINE:
        rs = [r for r in runs if r['name'].startswith('L8-%s-' % opt) and r['seed'] == 1]
        def pick(arm):
            c = [r for r in rs if r['arm'] == arm]
            return c[0] if c else None
        row = {'sync': pick('sync'), '2bw': pick('async')}
        for S in STAGES:
            row['S%d' % S] = pick('pipedream-S%d' % S)
        depth[opt] = row
        s = val(row['sync'])
        cells = [f4(s)]
        for k in ['2bw'] + ['S%d' % S for S in STAGES]:
            v = val(row[k])
            if row[k] and row[k]['status'] == 'diverged':
                cells.append('div.')
            else:
                cells.append('%s (%s)' % (f4(v), fsigned(v - s)))
        add('| %s | %s |' % (opt, ' | '.join(cells)))
        rl = [(row['sync'], 'sync'), (row['2bw'], '2BW, delay 1')]
        rl += [(row['S%d' % S], 'PipeDream S=%d' % S) for S in STAGES]
        plot(asyncpp, os.path.join(P, 'delay-%s.svg' % opt), rl,
             '%s, 8 layers: constant against per-stage delay' % opt, smooth=0.9,
             ymax=zoom([x for x, _ in rl]))
    add('')
    add('Mean delay over the layers: 2BW 1; PipeDream 0.5 (S=2), 1.5 (S=4), 3.5 (S=8). At S=2 '
        'PipeDream\'s delay is *smaller* than 2BW\'s on every layer (1 on the first half, 0 on '
        'the second), so it should do at least as well there; the claim is about deeper '
        'pipelines.')
    add('')
    for opt in HEADLINE:
        if os.path.exists(os.path.join(P, 'delay-%s.svg' % opt)):
            add('![%s delay](plots/delay-%s.svg)' % (opt, opt))
            add('')

    # ---- equivalence
    add('## The pipeline equivalence')
    add('')
    c1 = find(runs, name='check-delay1-M4')
    c2 = find(runs, name='check-2bw-S4-M4')
    if c1 and c2:
        l1 = [(s, l) for s, l in c1[0]['losses']]
        l2 = [(s, l) for s, l in c2[0]['losses']]
        v1 = c1[0]['vals']
        v2 = c2[0]['vals']
        same = l1 == l2 and v1 == v2
        add('AdamW, lr 3e-3, 4 micro-batches of 4 sequences per step, %d steps: a real 2BW '
            'pipeline (`train.schedule=2bw`, 4 stages, one thread each) against '
            '`train.delay=1` on one worker. Training losses equal at %d of %d steps, val '
            'losses equal at %d of %d evaluations (compared as the 9 significant digits of '
            'metrics.csv): **%s**. Final val loss %s against %s; wall time %.0f s (pipeline) '
            'against %.0f s (one worker).'
            % (c1[0]['steps'], sum(1 for a, b in zip(l1, l2) if a == b), len(l1),
               sum(1 for a, b in zip(v1, v2) if a == b), len(v1),
               'identical' if same else 'NOT identical', f4(val(c2[0])), f4(val(c1[0])),
               c2[0]['wall_s'], c1[0]['wall_s']))
    else:
        add('*Not run yet* (phase D of run.sh).')
    add('')

    # ---- findings
    add('## The findings, one by one')
    add('')
    add('Each statement is computed from the tables above (seed 1 at the best lr unless it '
        'says otherwise); nothing was tuned to make a finding hold. The seed spread (largest '
        '|seed 1 − seed 2| over the headline cells) is %s nats: differences smaller than that '
        'are noise. The test each verdict applies, fixed in report.py: (1) AdamW\'s gap is '
        'more than twice Muon\'s and larger than the seed spread; (2) the share recovered lies '
        'in 50–90%% for each optimizer whose gap exceeds the seed spread; (3) PipeDream is '
        'worse than 2BW at S = 4 and 8 and its margin grows with S; (4) the gap falls '
        'strictly as the momentum rises.' % f4(noise))
    add('')

    def gap_of(opt):
        b = headline[opt]
        return val(b['async']) - val(b['sync'])

    def rec_of(opt):
        b = headline[opt]
        g = gap_of(opt)
        return (val(b['async']) - val(b['async-ef'])) / g if g > 0 else math.nan

    def per_lr(opt):
        """[(lr, gap, recovered)] over the grid, seed 1, where all three arms finished."""
        out = []
        for lr in grid(runs, opt):
            v = {}
            for arm in ARMS:
                rr = [r for r in find(runs, optimizer=opt, arm=arm, lr=float(lr), seed=1)
                      if is_base(r)]
                v[arm] = val(rr[0]) if rr else math.nan
            g = v['async'] - v['sync']
            if math.isfinite(g) and math.isfinite(v['async-ef']):
                out.append((lr, g, (v['async'] - v['async-ef']) / g if g > 0 else math.nan))
        return out

    def span(xs, f):
        xs = [x for x in xs if not math.isnan(x)]
        return (f % min(xs)) + ' to ' + (f % max(xs)) if xs else '—'

    # F1
    ga, gm = gap_of('adamw'), gap_of('muon')
    if math.isnan(ga) or math.isnan(gm):
        f1 = 'not measured yet.'
    else:
        ratio = ga / gm if gm > 0 else math.inf
        holds = ga > 2 * max(gm, 0) and ga > (noise if not math.isnan(noise) else 0)
        f1 = ('**%s.** AdamW\'s sync→async gap is %+.4f nats, Muon\'s %+.4f (%s). ' % (
            'Holds' if holds else 'Does not hold here', ga, gm,
            ('AdamW\'s is %.1f× Muon\'s' % ratio) if math.isfinite(ratio) and gm > 0
            else 'Muon shows no gap at all'))
        if not math.isnan(seedgap.get('adamw', math.nan)):
            f1 += 'Averaged over two seeds: AdamW %+.4f, Muon %+.4f. ' % (seedgap['adamw'],
                                                                        seedgap['muon'])
        pa, pm = per_lr('adamw'), per_lr('muon')
        if pa and pm:
            f1 += ('Over the whole lr grid (sync and async at the same lr) the gaps run from %s for AdamW and from %s for Muon. '
                   % (span([g for _, g, _ in pa], '%+.3f'), span([g for _, g, _ in pm], '%+.3f')))
        others = ['%s %+.4f' % (o, gap_of(o)) for o in ['lion', 'sgd'] if not math.isnan(gap_of(o))]
        if others:
            f1 += 'The other optimizers: %s.' % ', '.join(others)
    add('1. *AdamW\'s gap is much larger than Muon\'s* (paper: > 0.2 against 0.012 nats at '
        '360M): ' + f1)
    add('')
    # F2
    parts = []
    verdicts = []
    for opt in OPTIMIZERS:
        g, r = gap_of(opt), rec_of(opt)
        if math.isnan(g):
            continue
        if g <= 0 or (not math.isnan(noise) and g <= noise):
            parts.append('%s: gap %+.4f is within the noise, so there is nothing to recover '
                         '(async + EF − sync = %+.4f)' % (opt, g,
                                                          val(headline[opt]['async-ef']) -
                                                          val(headline[opt]['sync'])))
            continue
        verdicts.append(0.5 <= r <= 0.9 if not math.isnan(r) else False)
        parts.append('%s: %s of a %+.4f gap%s' % (
            opt, pct(r), g, ' (more than closes it)' if r > 1 else ''))
    if not parts:
        f2 = 'not measured yet.'
    else:
        inrange = sum(verdicts)
        if verdicts and inrange == len(verdicts):
            v = '**Holds**'
        elif inrange:
            v = '**Holds for %d of the %d optimizers with a real gap**' % (inrange, len(verdicts))
        elif verdicts:
            v = '**Does not hold here** (not within 50–90%)'
        else:
            v = '**Cannot be tested here**'
        f2 = v + '. ' + '; '.join(parts) + '.'
        for opt in HEADLINE:
            if not math.isnan(seedrec.get(opt, math.nan)):
                f2 += ' Over two seeds, %s: %s.' % (opt, pct(seedrec[opt]))
        spans = ['%s %s' % (o, span([100 * r for _, g, r in per_lr(o) if g > 0], '%.0f%%'))
                 for o in OPTIMIZERS if per_lr(o)]
        if spans:
            f2 += ' Across the learning rates of the grid (seed 1) EF recovers: %s.' % '; '.join(spans)
    add('2. *Error feedback recovers 50–90% of the gap*: ' + f2)
    add('')
    # F3
    f3 = []
    for opt in HEADLINE:
        row = depth.get(opt)
        if not row or not row['2bw']:
            continue
        c = val(row['2bw'])
        diffs = [(S, val(row['S%d' % S]) - c) for S in STAGES if row['S%d' % S]]
        if not diffs:
            continue
        deep = [d for S, d in diffs if S >= 4]
        beats = all(d > 0 for d in deep) if deep else False
        grows = all(b[1] > a[1] for a, b in zip(diffs, diffs[1:]))
        f3.append('%s: PipeDream − 2BW = %s → %s' % (
            opt, ', '.join('%+.4f (S=%d)' % (d, S) for S, d in diffs),
            ('constant delay wins at depth and the margin grows with S' if beats and grows
             else 'constant delay wins at depth, but the margin does not grow steadily with S'
             if beats else 'constant delay does not win at depth')))
    if f3:
        holds = all('grows with S' in x for x in f3)
        some = any('wins at depth' in x and 'does not win' not in x for x in f3)
        add('3. *A constant delay beats the variable delay of the original PipeDream, more so '
            'with depth*: **%s.** %s.' % ('Holds' if holds else 'Holds in part' if some
                                          else 'Does not hold here', '; '.join(f3)))
    else:
        add('3. *A constant delay beats the variable delay of the original PipeDream, more so '
            'with depth*: not measured yet.')
    add('')
    # F4
    f4s = []
    for opt in HEADLINE:
        gs = [(m, momgap.get((opt, m), math.nan)) for m in MOMENTA]
        gs = [(m, g) for m, g in gs if not math.isnan(g)]
        if len(gs) < 2:
            continue
        shrinks = all(b[1] < a[1] for a, b in zip(gs, gs[1:]))
        f4s.append((opt, shrinks, '%s: gap %s%s' % (
            opt, ', '.join('%+.4f (%s)' % (g, m) for m, g in gs),
            ' — shrinks as momentum grows' if shrinks else
            ' — grows with momentum, the opposite' if all(b[1] > a[1] for a, b in zip(gs, gs[1:]))
            else ' — does not shrink steadily')))
    if f4s:
        n = sum(s for _, s, _ in f4s)
        add('4. *Higher momentum shrinks the gap*: **%s.** %s.' % (
            'Holds' if n == len(f4s) else 'Holds for %s only' % f4s[[s for _, s, _ in f4s].index(True)][0]
            if n else 'Does not hold here', '; '.join(t for _, _, t in f4s)))
    else:
        add('4. *Higher momentum shrinks the gap*: not measured yet.')
    add('')
    add('Scale matters: these models have 1.4–2.2 M parameters and each run sees %.2f M tokens '
        '(about half an epoch of the KJV), far from the paper\'s 360 M – 10 B parameters and '
        '20 tokens per parameter; the statements above are about this setting only.'
        % (tokens / 1e6))
    add('')

    new_sections(runs, P, asyncpp, work, add)

    # ---- wall time
    add('## Wall time per run')
    add('')
    ok = [r for r in runs if not math.isnan(r['wall_s'])]
    if ok:
        def grp(r):
            if r['name'].startswith('check-'):
                return r['name']
            if r['name'].startswith('long-'):
                return 'long horizon (%d steps), %s' % (r['steps'], r['optimizer'])
            if r['n_expert']:
                return 'MoE, %s' % r['optimizer']
            return '%d layers, %s' % (r['n_layer'], r['optimizer'])
        groups = {}
        for r in ok:
            groups.setdefault(grp(r), []).append(r)
        add('On this machine (2 shared CPU cores, one thread per run, two runs at a time, other '
            'work running beside): median wall time and CPU time per run.')
        add('')
        add('| runs | count | median wall s | median CPU s |')
        add('|---|---|---|---|')
        for k in sorted(groups):
            g = groups[k]
            add('| %s | %d | %.0f | %.0f |' % (k, len(g), statistics.median(x['wall_s'] for x in g),
                                              statistics.median(x['cpu_s'] for x in g)))
        add('')
        add('All %d runs: %.0f s of wall time, %.1f CPU-hours. Every run\'s own time is in '
            '`results.csv` (`wall_s`, `cpu_s`).' % (len(ok), sum(r['wall_s'] for r in ok),
                                                   sum(r['cpu_s'] for r in ok) / 3600))
        add('')

    # ---- missing
    add('## Missing runs')
    add('')
    if missing:
        add('%d planned runs have not finished (phase: name). `experiments/run.sh` runs them:'
            % len(missing))
        add('')
        for p, n in missing:
            add('- %s: `%s`' % (p, n))
    else:
        add('None: every planned run has finished.')
    if failed_or_pending_B:
        add('')
        add('The runs that depend on the best learning rates (grid extensions, seed 2, '
            'momentum, 8-layer depth) are planned from the results before them and are not '
            'listed until those exist.')
    if any(p_ in 'EFG' for p_, _ in missing) or not all(grid4_done(runs, o)
                                                        for o in ALL_OPTIMIZERS):
        add('')
        add('Phase E\'s grid extension and seed-2 cells, phase F (the best sync lr and the '
            'parameter count) and phase G (the best dense sync lr) are likewise listed only '
            'once the runs they follow from have finished.')
    add('')
    add('## Reproducing these numbers')
    add('')
    add('The runs above were made by one binary (`experiments/work/asyncpp-grid`, built from '
        'the code of commit 38800b5, before 5d57662 reordered the sums of the CPU attention '
        'backward). Floating-point sums in a new order change the last bits, and 300 steps '
        'of training carry those differences forward, so a rerun with later code gives '
        'nearby but not identical losses. Measured by rerunning two cells from their saved '
        '`config.ini` with the code of commit a11d48b: adamw sync lr 3e-3 ends at val loss '
        '4.24978 against 4.25009 here (3.1e-4), lion sync lr 3e-4 at 4.74906 against '
        '4.74907 (1.3e-5); the largest seed spread above is 0.0142. Any one binary is '
        'deterministic: the same run gives the same bits for any thread count, and '
        '`run.sh` never reruns a finished cell, so a grid is only comparable within '
        'the binary that made it (delete `work/runs/` to remake all of it).')
    add('')
    add('## Files')
    add('')
    add('- `run.sh`: the whole pipeline (data, grid, report); `report.py`: the plan of the '
        'grid, `results.csv`, the plots and this report.')
    add('- `results.csv`: one row per finished run: optimizer, arm, schedule, delay, '
        'delay_mode, correction, lr, beta1, momentum, stages, micro-batches, layers, seed, '
        'steps, status (ok or diverged), final train loss (mean of the last 10 steps), final '
        'val loss, tokens, wall and CPU seconds, and the code that made it (the commit of '
        'the checkout run.sh ran in, -dirty when code outside experiments/ had uncommitted '
        'changes; empty for runs made before run.sh recorded it).')
    add('- `plots/*.svg`: drawn by `asyncpp plot` from the runs\' metrics.csv.')
    add('')
    tmp = os.path.join(exp, 'README.md.tmp')
    with open(tmp, 'w') as f:
        f.write('\n'.join(L))
    os.replace(tmp, os.path.join(exp, 'README.md'))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument('--work', default=os.path.join(here, 'work'))
    ap.add_argument('--exp', default=here)
    ap.add_argument('--asyncpp', default=os.path.join(os.path.dirname(here), 'asyncpp'))
    ap.add_argument('what', choices=['plan', 'best', 'status', 'all'])
    ap.add_argument('args', nargs='*')
    a = ap.parse_args()
    global ASYNCPP
    ASYNCPP = a.asyncpp
    runs = load_runs(a.work)
    if a.what == 'plan':
        if len(a.args) != 1 or len(a.args[0]) != 1 or a.args[0] not in PHASES:
            ap.error('plan needs a phase: one of ' + ', '.join(PHASES))
        for name, sets in plan(a.args[0], runs):
            print(name, ' '.join(sets))
    elif a.what == 'best':
        if len(a.args) != 2:
            ap.error('best needs OPTIMIZER ARM')
        if a.args[0] in NEW_OPTIMIZERS or a.args[1] == 'async-predict':
            b = best4(runs, a.args[0], a.args[1])
        else:
            b = best_run(runs, a.args[0], a.args[1])
        if not b:
            sys.exit(1)
        print(fmt_lr(b['lr']))
    elif a.what == 'status':
        planned = full_plan(runs)
        have = {r['name'] for r in runs}
        running = []
        rdir = os.path.join(a.work, 'runs')
        for p, n, _ in planned:
            if n not in have and os.path.isdir(os.path.join(rdir, n)):
                running.append(n)
        for p in PHASES:
            names = [n for q, n, _ in planned if q == p]
            print('phase %s: %d of %d finished%s' % (
                p, sum(n in have for n in names), len(names),
                ' (skipped: %s does not know model.n_expert)' % a.asyncpp
                if p == 'G' and not moe_supported() else ''))
        if running:
            print('started, not finished: ' + ' '.join(running))
        print('%d of %d planned runs finished, %d runs in all' % (
            sum(n in have for _, n, _ in planned), len(planned), len(runs)))
    else:
        write_results(runs, os.path.join(a.exp, 'results.csv'))
        build_report(runs, a.exp, a.asyncpp, a.work)


if __name__ == '__main__':
    main()
