#!/usr/bin/env python3
"""optim_reference.py - the paper's optimizers written from their formulas
in double precision, independent of the C code, on the fixture of
tests/unit/test_optim.c: a decayed 2x3 hidden matrix (elements 0..5,
row-major) and a 3-vector (elements 6..8, not decayed); w_i = 1 - 0.1 i;
gradient of step t, element i: 0.5 sin(1 + 0.7 i + 2.3 t + 0.13 i t)
(the last term turns the gradients' column space from step to step, so
SOAP's factors have no fixed null space); constant lr.
Writes tests/unit/fixtures/optim_reference.h: the weights after each step.
Run it again after changing a formula here, and commit the header.

Decoupled weight decay everywhere: w = w (1 - lr wd) + u, on the matrix
only. The matrix optimizers (mars, normuon, soap) give the vector AdamW
with the same betas and eps (the paper's hybrid rule).

AdamW (Loshchilov and Hutter 2019): m = b1 m + (1-b1) g; v = b2 v + (1-b2)
  g^2; u = -lr (m/bc1) / (sqrt(v/bc2) + eps), bc_i = 1 - b_i^t.
Lion (Chen et al. 2023): c = b1 m + (1-b1) g; u = -lr sign(c) (0 where c is
  0); then m = b2 m + (1-b2) g.
SGD with momentum: m = mu m + g; u = -lr (g + mu m) (Nesterov) or -lr m.
Muon (Jordan et al. 2024): m = mu m + g; x = g + mu m (Nesterov); O = the
  quintic Newton-Schulz of x (as for NorMuon below); u = -lr s O with s =
  0.2 sqrt(max(rows, cols)) (rms: an update of RMS about 0.2 lr, like
  AdamW's) or sqrt(max(1, rows/cols)) (shape); the vector takes AdamW.
Adan (Xie et al. 2022, as its reference implementation computes it):
  d = g - g_prev (0 at step 1); m = b1 m + (1-b1) g; v = b2 v + (1-b2) d;
  n = b3 n + (1-b3) (g + b2 d)^2;
  u = -lr (m/bc1 + b2 v/bc2) / (sqrt(n)/sqrt(bc3) + eps), bc_i = 1 - b_i^t.
MARS-AdamW, approximate (Yuan et al. 2024): c = g + gamma b1/(1-b1) (g -
  g_prev), g_prev = 0 before step 1; c /= |c| when |c| > 1; AdamW on c.
AdEMAMix (Pagliardini et al. 2024): m1 = b1 m1 + (1-b1) g; m2 = b3(t) m2 +
  (1-b3(t)) g; nu = b2 nu + (1-b2) g^2;
  u = -lr (m1/bc1 + alpha(t) m2) / (sqrt(nu)/sqrt(bc2) + eps), with
  alpha(t) = alpha min(t/T, 1), b3(t) = min(exp(ln b1 ln b3 / ((1-t/T) ln b3
  + (t/T) ln b1)), b3) for t < T.
NorMuon (Li et al. 2025): m = mu m + g; x = g + mu m (Nesterov); O = the
  quintic Newton-Schulz of x/(|x| + 1e-7) (5 steps, (3.4445, -4.7750,
  2.0315)); per row v = b2 v + (1-b2) mean(O_row^2), O_row /= sqrt(v) +
  1e-10; then rms: O 0.2 sqrt(rows cols)/(|O| + 1e-10), or shape: O
  |O_before|/(|O| + 1e-10) sqrt(max(1, rows/cols)); u = -lr O.
SOAP (Vyas et al. 2024): step 1 builds L = (1-b2) G G^T, R = (1-b2) G^T G
  and their eigenbases (columns by descending eigenvalue) and leaves the
  matrix alone (no decay either); step t > 1, s = t - 1: G' = QL^T G QR,
  m = b1 m + (1-b1) G, v = b2 v + (1-b2) G'^2, N = QL (QL^T m QR / (sqrt(v)
  + eps)) QR^T, u = -lr sqrt(1-b2^s)/(1-b1^s) N; then L, R updated with G,
  and when s % f == 0 each basis: columns ordered by diag(Q^T P Q)
  descending (v's rows / columns with them), Q = qr(P Q).
"""
import math, os

N, ROWS, COLS = 9, 2, 3
DECAYED = ROWS * COLS

def grad(t, i):
    return 0.5 * math.sin(1.0 + 0.7 * i + 2.3 * t + 0.13 * i * t)

def grad_swap(t, i):
    """grad, but the matrix's row 0 dominates at step 1 and row 1 after it:
    the order of L's eigenvalues flips, so SOAP's refresh must reorder."""
    if i >= DECAYED:
        return grad(t, i)
    strong = (i // COLS == 0) == (t == 1)
    return grad(t, i) * (1.0 if strong else 0.05)

def grad_small(t, i):
    """grad at 0.2 the size: MARS's corrected gradient stays under norm 1
    (the branch without clipping)."""
    return 0.2 * grad(t, i)

def init():
    return [1.0 - 0.1 * i for i in range(N)]

# ---- small dense linear algebra (lists of rows) ----
def matmul(a, b):
    return [[sum(a[i][k] * b[k][j] for k in range(len(b))) for j in range(len(b[0]))]
            for i in range(len(a))]

def tr(a):
    return [list(r) for r in zip(*a)]

def eigh_desc(a):
    """Cyclic Jacobi rotations; returns (eigenvalues, Q with eigenvectors as
    columns), descending."""
    n = len(a)
    a = [list(r) for r in a]
    q = [[float(i == j) for j in range(n)] for i in range(n)]
    for _ in range(100):
        off = sum(a[i][j] ** 2 for i in range(n) for j in range(n) if i != j)
        if off < 1e-30:
            break
        for p in range(n):
            for r in range(p + 1, n):
                if abs(a[p][r]) < 1e-300:
                    continue
                theta = (a[r][r] - a[p][p]) / (2 * a[p][r])
                t = (1.0 if theta >= 0 else -1.0) / (abs(theta) + math.sqrt(theta * theta + 1))
                c = 1 / math.sqrt(t * t + 1)
                s = t * c
                for k in range(n):  # a = J^T a J
                    akp, akr = a[k][p], a[k][r]
                    a[k][p], a[k][r] = c * akp - s * akr, s * akp + c * akr
                for k in range(n):
                    apk, ark = a[p][k], a[r][k]
                    a[p][k], a[r][k] = c * apk - s * ark, s * apk + c * ark
                for k in range(n):
                    qkp, qkr = q[k][p], q[k][r]
                    q[k][p], q[k][r] = c * qkp - s * qkr, s * qkp + c * qkr
    w = [a[i][i] for i in range(n)]
    order = sorted(range(n), key=lambda i: -w[i])
    return [w[i] for i in order], [[q[k][i] for i in order] for k in range(n)]

def qr_q(a):
    """Modified Gram-Schmidt on the columns of a square matrix."""
    n = len(a)
    cols = [[a[i][j] for i in range(n)] for j in range(n)]
    out = []
    for v in cols:
        v = list(v)
        for u in out:
            d = sum(x * y for x, y in zip(u, v))
            v = [x - d * y for x, y in zip(v, u)]
        nrm = math.sqrt(sum(x * x for x in v))
        out.append([x / nrm for x in v])
    return [[out[j][i] for j in range(n)] for i in range(n)]

def mat(flat):
    return [flat[r * COLS:(r + 1) * COLS] for r in range(ROWS)]

def flat(m):
    return [x for r in m for x in r]

# ---- the optimizers: each returns the weights after steps 1..steps ----
def run(step_fn, steps, lr, wd, state, gradient=grad):
    w = init()
    out = []
    for t in range(1, steps + 1):
        g = [gradient(t, i) for i in range(N)]
        u, decay_matrix = step_fn(state, g, t)
        for i in range(N):
            d = wd if (i < DECAYED and decay_matrix) else 0.0
            w[i] = w[i] * (1 - lr * d) + u[i]
        out.append(list(w))
    return out

def adamw(st, key, g, t, lr, b1, b2, eps):
    m, v = st.setdefault(key, ([0.0] * len(g), [0.0] * len(g)))
    bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
    u = []
    for i, gi in enumerate(g):
        m[i] = b1 * m[i] + (1 - b1) * gi
        v[i] = b2 * v[i] + (1 - b2) * gi * gi
        u.append(-lr * (m[i] / bc1) / (math.sqrt(v[i] / bc2) + eps))
    return u

def adan(lr=0.01, b1=0.98, b2=0.92, b3=0.99, eps=1e-8, wd=0.02, steps=6):
    def step(st, g, t):
        m, v, n, prev = st.setdefault('s', ([0.0] * N, [0.0] * N, [0.0] * N, [0.0] * N))
        bc1, bc2, bc3 = 1 - b1 ** t, 1 - b2 ** t, 1 - b3 ** t
        u = []
        for i in range(N):
            d = 0.0 if t == 1 else g[i] - prev[i]
            m[i] = b1 * m[i] + (1 - b1) * g[i]
            v[i] = b2 * v[i] + (1 - b2) * d
            n[i] = b3 * n[i] + (1 - b3) * (g[i] + b2 * d) ** 2
            prev[i] = g[i]
            u.append(-lr * (m[i] / bc1 + b2 * v[i] / bc2) / (math.sqrt(n[i]) / math.sqrt(bc3) + eps))
        return u, True
    return run(step, steps, lr, wd, {})

def mars(lr=0.01, b1=0.95, b2=0.99, gamma=0.025, eps=1e-8, wd=0.1, steps=6, gradient=grad):
    def step(st, g, t):
        prev = st.setdefault('prev', [0.0] * DECAYED)
        gm = g[:DECAYED]
        c = [gi + gamma * b1 / (1 - b1) * (gi - pi) for gi, pi in zip(gm, prev)]
        st['prev'] = list(gm)
        nrm = math.sqrt(sum(x * x for x in c))
        if nrm > 1:
            c = [x / nrm for x in c]
        st.setdefault('clipped', []).append(nrm > 1)
        return (adamw(st, 'mat', c, t, lr, b1, b2, eps) +
                adamw(st, 'vec', g[DECAYED:], t, lr, b1, b2, eps)), True
    st = {}
    out = run(step, steps, lr, wd, st, gradient)
    assert all(st['clipped']) if gradient is grad else not any(st['clipped'])
    return out

def ademamix(lr=0.01, b1=0.9, b2=0.999, b3=0.9999, alpha=5.0, T=4, eps=1e-8, wd=0.1, steps=6):
    def step(st, g, t):
        m1, m2, nu = st.setdefault('s', ([0.0] * N, [0.0] * N, [0.0] * N))
        if t < T:
            f = t / T
            a = f * alpha
            b3t = min(math.exp(math.log(b1) * math.log(b3) /
                               ((1 - f) * math.log(b3) + f * math.log(b1))), b3)
        else:
            a, b3t = alpha, b3
        bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
        u = []
        for i in range(N):
            m1[i] = b1 * m1[i] + (1 - b1) * g[i]
            m2[i] = b3t * m2[i] + (1 - b3t) * g[i]
            nu[i] = b2 * nu[i] + (1 - b2) * g[i] ** 2
            u.append(-lr * (m1[i] / bc1 + a * m2[i]) / (math.sqrt(nu[i]) / math.sqrt(bc2) + eps))
        return u, True
    return run(step, steps, lr, wd, {})

def adamw_all(lr=0.01, b1=0.9, b2=0.95, eps=1e-8, wd=0.1, steps=6):
    def step(st, g, t):
        return adamw(st, 'all', g, t, lr, b1, b2, eps), True
    return run(step, steps, lr, wd, {})

def lion(lr=0.01, b1=0.9, b2=0.95, wd=0.1, steps=6):
    def step(st, g, t):
        m = st.setdefault('m', [0.0] * N)
        u = []
        for i, gi in enumerate(g):
            c = b1 * m[i] + (1 - b1) * gi
            u.append(-lr if c > 0 else lr if c < 0 else 0.0)
            m[i] = b2 * m[i] + (1 - b2) * gi
        return u, True
    return run(step, steps, lr, wd, {})

def sgd(nesterov, lr=0.01, mu=0.9, wd=0.1, steps=6):
    def step(st, g, t):
        m = st.setdefault('m', [0.0] * N)
        u = []
        for i, gi in enumerate(g):
            m[i] = mu * m[i] + gi
            u.append(-lr * (gi + mu * m[i] if nesterov else m[i]))
        return u, True
    return run(step, steps, lr, wd, {})

def newton_schulz(x, steps=5):
    a, b, c = 3.4445, -4.7750, 2.0315
    transposed = len(x) > len(x[0])
    if transposed:
        x = tr(x)
    nrm = math.sqrt(sum(v * v for r in x for v in r)) + 1e-7
    x = [[v / nrm for v in r] for r in x]
    for _ in range(steps):
        A = matmul(x, tr(x))
        AA = matmul(A, A)
        B = [[b * A[i][j] + c * AA[i][j] for j in range(len(A))] for i in range(len(A))]
        BX = matmul(B, x)
        x = [[a * x[i][j] + BX[i][j] for j in range(len(x[0]))] for i in range(len(x))]
    return tr(x) if transposed else x

def nesterov(st, g, mu):
    """The matrix's momentum m = mu m + g; returns g + mu m (Nesterov)."""
    mom = st.setdefault('mom', [0.0] * DECAYED)
    for i in range(DECAYED):
        mom[i] = mu * mom[i] + g[i]
    return [g[i] + mu * mom[i] for i in range(DECAYED)]

def muon(scale, lr=0.01, mu=0.9, b1=0.9, b2=0.95, eps=1e-8, wd=0.1, steps=6):
    def step(st, g, t):
        O = newton_schulz(mat(nesterov(st, g, mu)))
        if scale == 'rms':
            s = 0.2 * math.sqrt(max(ROWS, COLS))
        else:
            s = math.sqrt(max(1.0, ROWS / COLS))
        return [-lr * s * e for e in flat(O)] + adamw(st, 'vec', g[DECAYED:], t, lr, b1, b2, eps), True
    return run(step, steps, lr, wd, {})

def normuon(scale, lr=0.01, mu=0.9, b1=0.9, b2=0.95, eps=1e-8, wd=0.1, steps=6):
    def step(st, g, t):
        v = st.setdefault('v', [0.0] * ROWS)
        O = newton_schulz(mat(nesterov(st, g, mu)))
        before = math.sqrt(sum(e * e for r in O for e in r))
        for r in range(ROWS):
            v[r] = b2 * v[r] + (1 - b2) * sum(e * e for e in O[r]) / COLS
            O[r] = [e / (math.sqrt(v[r]) + 1e-10) for e in O[r]]
        after = math.sqrt(sum(e * e for r in O for e in r)) + 1e-10
        if scale == 'rms':
            s = 0.2 * math.sqrt(ROWS * COLS) / after
        else:
            s = before / after * math.sqrt(max(1.0, ROWS / COLS))
        return [-lr * s * e for e in flat(O)] + adamw(st, 'vec', g[DECAYED:], t, lr, b1, b2, eps), True
    return run(step, steps, lr, wd, {})

def soap(lr=0.01, b1=0.95, b2=0.95, eps=1e-8, wd=0.01, every=2, steps=8, gradient=grad):
    def step(st, g, t):
        G = mat(g[:DECAYED])
        vec = adamw(st, 'vec', g[DECAYED:], t, lr, b1, b2, eps)
        def update_factors():
            GGt, GtG = matmul(G, tr(G)), matmul(tr(G), G)
            st['L'] = [[b2 * st['L'][i][j] + (1 - b2) * GGt[i][j] for j in range(ROWS)] for i in range(ROWS)]
            st['R'] = [[b2 * st['R'][i][j] + (1 - b2) * GtG[i][j] for j in range(COLS)] for i in range(COLS)]
        if t == 1:
            st['L'] = [[0.0] * ROWS for _ in range(ROWS)]
            st['R'] = [[0.0] * COLS for _ in range(COLS)]
            update_factors()
            st['QL'] = eigh_desc(st['L'])[1]
            st['QR'] = eigh_desc(st['R'])[1]
            st['m'] = [[0.0] * COLS for _ in range(ROWS)]
            st['v'] = [[0.0] * COLS for _ in range(ROWS)]
            return [0.0] * DECAYED + vec, False
        s = t - 1
        QL, QR, m, v = st['QL'], st['QR'], st['m'], st['v']
        rot = lambda X: matmul(matmul(tr(QL), X), QR)
        Gp = rot(G)
        for i in range(ROWS):
            for j in range(COLS):
                m[i][j] = b1 * m[i][j] + (1 - b1) * G[i][j]
                v[i][j] = b2 * v[i][j] + (1 - b2) * Gp[i][j] ** 2
        Mp = rot(m)
        Np = [[Mp[i][j] / (math.sqrt(v[i][j]) + eps) for j in range(COLS)] for i in range(ROWS)]
        Nn = matmul(matmul(QL, Np), tr(QR))
        k = -lr * math.sqrt(1 - b2 ** s) / (1 - b1 ** s)
        u = [k * e for e in flat(Nn)]
        update_factors()
        if s % every == 0:
            for side, (P, Q) in enumerate(((st['L'], QL), (st['R'], QR))):
                PQ = matmul(P, Q)
                n = len(P)
                est = [sum(Q[i][c] * PQ[i][c] for i in range(n)) for c in range(n)]
                order = sorted(range(n), key=lambda c: -est[c])
                if side == 0:
                    st['v'] = [list(v[order[i]]) for i in range(ROWS)]
                else:
                    st['v'] = [[v[i][order[j]] for j in range(COLS)] for i in range(ROWS)]
                v = st['v']
                newQ = qr_q([[PQ[i][order[c]] for c in range(n)] for i in range(n)])
                if side == 0:
                    st['QL'] = newQ
                else:
                    st['QR'] = newQ
        return u + vec, True
    return run(step, steps, lr, wd, {}, gradient)

def emit(f, name, comment, rows):
    f.write('/* %s: weights after steps 1..%d */\n' % (comment, len(rows)))
    f.write('static const double %s[%d][%d] = {\n' % (name, len(rows), N))
    for r in rows:
        f.write('\t{' + ', '.join('%.17g' % x for x in r) + '},\n')
    f.write('};\n')

def main():
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, 'unit', 'fixtures', 'optim_reference.h')
    with open(path + '.tmp', 'w') as f:
        f.write('/* generated by tests/optim_reference.py (double precision); do not edit */\n')
        emit(f, 'adamw_reference', 'AdamW, lr 0.01, betas (0.9, 0.95), eps 1e-8, wd 0.1', adamw_all())
        emit(f, 'lion_reference', 'Lion, lr 0.01, betas (0.9, 0.95), wd 0.1', lion())
        emit(f, 'sgd_nesterov_reference', 'SGD, lr 0.01, momentum 0.9, Nesterov, wd 0.1', sgd(True))
        emit(f, 'sgd_reference', 'SGD, lr 0.01, momentum 0.9, wd 0.1', sgd(False))
        emit(f, 'muon_rms_reference', 'Muon (rms scale), lr 0.01, momentum 0.9, wd 0.1', muon('rms'))
        emit(f, 'muon_shape_reference', 'Muon (shape scale), lr 0.01, momentum 0.9, wd 0.1', muon('shape'))
        emit(f, 'adan_reference', 'Adan, lr 0.01, betas (0.98, 0.92, 0.99), eps 1e-8, wd 0.02', adan())
        emit(f, 'mars_reference', 'MARS-AdamW, lr 0.01, betas (0.95, 0.99), gamma 0.025, wd 0.1', mars())
        emit(f, 'mars_small_reference', 'MARS as above on grad_small (never clipped)', mars(gradient=grad_small))
        emit(f, 'ademamix_reference', 'AdEMAMix, lr 0.01, betas (0.9, 0.999, 0.9999), alpha 5, warm-up 4, wd 0.1', ademamix())
        emit(f, 'normuon_rms_reference', 'NorMuon (rms scale), lr 0.01, momentum 0.9, beta2 0.95, wd 0.1', normuon('rms'))
        emit(f, 'normuon_shape_reference', 'NorMuon (shape scale), lr 0.01, momentum 0.9, beta2 0.95, wd 0.1', normuon('shape'))
        emit(f, 'soap_reference', 'SOAP, lr 0.01, betas (0.95, 0.95), eps 1e-8, wd 0.01, refresh every 2', soap())
        emit(f, 'soap_swap_reference', 'SOAP as above on grad_swap (the refresh reorders)', soap(gradient=grad_swap))
    os.replace(path + '.tmp', path)

if __name__ == '__main__':
    main()
