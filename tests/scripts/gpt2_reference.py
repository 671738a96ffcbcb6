#!/usr/bin/env python3
"""gpt2_reference.py OUT.bin - an independent GPT-2 forward in plain Python.

Writes a small random llm.c GPT-2 checkpoint (header 20240326, version 3,
fp32, llm.c's all-layers-per-tensor order) to OUT.bin and prints, for fixed
tokens and targets, the mean cross-entropy loss computed here in double
precision from the fp32-rounded weights. No numpy: the model is tiny.

Output (stdout):
    B T
    tokens: B*T ints
    targets: B*T ints
    loss: FLOAT
"""
import math
import random
import struct
import sys

V, VP, L, C, NH, MAXT = 50, 64, 2, 16, 2, 8
B, T = 2, 8
EPS = 1e-5


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def tensor(rng, n, kind):
    if kind == "w":       # matrices and embeddings
        return [f32(rng.gauss(0.0, 0.3)) for _ in range(n)]
    if kind == "g":       # norm gains
        return [f32(1.0 + rng.gauss(0.0, 0.2)) for _ in range(n)]
    return [f32(rng.gauss(0.0, 0.1)) for _ in range(n)]  # biases


def build(rng):
    p = {}
    p["wte"] = tensor(rng, VP * C, "w")  # padded rows too: never a target
    p["wpe"] = tensor(rng, MAXT * C, "w")
    shapes = [("ln1w", C, "g"), ("ln1b", C, "b"), ("qkvw", 3 * C * C, "w"),
              ("qkvb", 3 * C, "b"), ("attprojw", C * C, "w"), ("attprojb", C, "b"),
              ("ln2w", C, "g"), ("ln2b", C, "b"), ("fcw", 4 * C * C, "w"),
              ("fcb", 4 * C, "b"), ("fcprojw", C * 4 * C, "w"), ("fcprojb", C, "b")]
    for name, n, kind in shapes:
        p[name] = [tensor(rng, n, kind) for _ in range(L)]
    p["lnfw"] = tensor(rng, C, "g")
    p["lnfb"] = tensor(rng, C, "b")
    return p, [s[0] for s in shapes]


def write(path, p, layer_names):
    hdr = [0] * 256
    hdr[:8] = [20240326, 3, MAXT, V, L, NH, C, VP]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *hdr))
        order = ["wte", "wpe"] + layer_names + ["lnfw", "lnfb"]
        for name in order:
            vals = p[name]
            if name in layer_names:
                vals = [x for layer in vals for x in layer]
            f.write(struct.pack("<%df" % len(vals), *vals))


def layernorm(x, w, b):
    mean = sum(x) / len(x)
    var = sum((v - mean) ** 2 for v in x) / len(x)
    r = 1.0 / math.sqrt(var + EPS)
    return [(v - mean) * r * w[i] + b[i] for i, v in enumerate(x)]


def linear(x, w, b, out):
    n = len(x)
    return [sum(w[o * n + i] * x[i] for i in range(n)) + (b[o] if b else 0.0)
            for o in range(out)]


def gelu(x):
    return 0.5 * x * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def forward(p, seq):
    hs = C // NH
    xs = [[p["wte"][tok * C + i] + p["wpe"][t * C + i] for i in range(C)]
          for t, tok in enumerate(seq)]
    for l in range(L):
        qkv = [linear(layernorm(x, p["ln1w"][l], p["ln1b"][l]), p["qkvw"][l],
                      p["qkvb"][l], 3 * C) for x in xs]
        ys = []
        for t in range(len(xs)):
            y = [0.0] * C
            for h in range(NH):
                q = qkv[t][h * hs:(h + 1) * hs]
                scores = []
                for s in range(t + 1):
                    k = qkv[s][C + h * hs:C + (h + 1) * hs]
                    scores.append(sum(a * b for a, b in zip(q, k)) / math.sqrt(hs))
                m = max(scores)
                e = [math.exp(s - m) for s in scores]
                z = sum(e)
                for s in range(t + 1):
                    v = qkv[s][2 * C + h * hs:2 * C + (h + 1) * hs]
                    for i in range(hs):
                        y[h * hs + i] += e[s] / z * v[i]
            ys.append(y)
        xs = [[a + b for a, b in zip(x, linear(y, p["attprojw"][l], p["attprojb"][l], C))]
              for x, y in zip(xs, ys)]
        out = []
        for x in xs:
            h = linear(layernorm(x, p["ln2w"][l], p["ln2b"][l]), p["fcw"][l], p["fcb"][l], 4 * C)
            h = [gelu(v) for v in h]
            out.append([a + b for a, b in zip(x, linear(h, p["fcprojw"][l], p["fcprojb"][l], C))])
        xs = out
    logits = []
    for x in xs:
        xf = layernorm(x, p["lnfw"], p["lnfb"])
        logits.append(linear(xf, p["wte"][:V * C], None, V))  # tied head, first V rows
    return logits


def write_token_shard(path, stream):
    """llm.c's token shard: 256 int32 header [20240520, 1, n], uint16 tokens."""
    header = [20240520, 1, len(stream)] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack("<%dH" % len(stream), *stream))


def main():
    # gpt2_reference.py OUT.bin [TOKENS.bin]: with TOKENS.bin the targets
    # are the next tokens of one stream, written as an llm.c token shard, so
    # `asyncpp eval` can compute the same loss through the command line
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: gpt2_reference.py OUT.bin [TOKENS.bin]")
    rng = random.Random(20240326)
    p, layer_names = build(rng)
    write(sys.argv[1], p, layer_names)
    if len(sys.argv) == 3:
        stream = [rng.randrange(V) for _ in range(B * T + 1)]
        tokens = [stream[b * T + t] for b in range(B) for t in range(T)]
        targets = [stream[b * T + t + 1] for b in range(B) for t in range(T)]
        write_token_shard(sys.argv[2], stream)
    else:
        tokens = [rng.randrange(V) for _ in range(B * T)]
        targets = [rng.randrange(V) for _ in range(B * T)]
    total = 0.0
    for b in range(B):
        logits = forward(p, tokens[b * T:(b + 1) * T])
        for t in range(T):
            row = logits[t]
            m = max(row)
            lse = m + math.log(sum(math.exp(v - m) for v in row))
            total += lse - row[targets[b * T + t]]
    print(B, T)
    print("tokens:", " ".join(map(str, tokens)))
    print("targets:", " ".join(map(str, targets)))
    print("loss: %.17g" % (total / (B * T)))


if __name__ == "__main__":
    main()
