#!/usr/bin/env python3
"""hf_fixture.py OUTDIR - tiny Hugging Face model folders and their logits.

Writes, with plain Python (no numpy, torch or transformers):
  OUTDIR/gpt2/        GPT2LMHeadModel, F32, hub-style names (no
                      "transformer." prefix, attn.bias mask buffers), tied
  OUTDIR/llama/       LlamaForCausalLM, BF16, GQA (4 heads, 2 kv heads),
                      untied, rope_theta 500000, sharded in two files
  OUTDIR/llama-tied/  LlamaForCausalLM, F16, tied, one file
  OUTDIR/mixtral/     MixtralForCausalLM, F32, 4 experts, top-2, untied
each with config.json, safetensors weights, tokenizer.json (byte-level
BPE: 256 bytes, 4 merges, <|endoftext|>) and expected.txt: the tokens and
the logits at every position computed here in double precision from the
stored (rounded) weights, following the Hugging Face modules' maths:
GPT-2: Conv1D (y = x W + b, W stored (in, out)), gelu_new, LayerNorm;
Llama: RMSNorm, rotate_half RoPE, grouped-query attention, SwiGLU;
Mixtral: Llama's attention, softmax router, top-2 renormalised, SwiGLU experts.
tests/unit/test_hf.c compares asyncpp's logits with expected.txt.
The output is deterministic; testdata/hf holds the committed copy.
"""
import json
import math
import os
import random
import struct
import sys

V = 261  # 256 bytes + 4 merges + <|endoftext|>
TOKENS = [72, 257, 3, 259, 100, 260, 17]


# ---- numbers as the file stores them ----

def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def bf16_bits(x):
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    u += 0x7FFF + ((u >> 16) & 1)
    return (u >> 16) & 0xFFFF


def rounded(x, dtype):
    if dtype == "F32":
        return f32(x)
    if dtype == "F16":
        return struct.unpack("<e", struct.pack("<e", x))[0]
    return struct.unpack("<f", struct.pack("<I", bf16_bits(x) << 16))[0]


def pack(vals, dtype):
    if dtype == "F32":
        return struct.pack("<%df" % len(vals), *vals)
    if dtype == "F16":
        return struct.pack("<%de" % len(vals), *vals)
    return struct.pack("<%dH" % len(vals), *[bf16_bits(v) for v in vals])


def write_safetensors(path, tensors, dtype):
    """tensors: list of (name, shape, flat values)"""
    hdr, off, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name, shape, vals in tensors:
        blob = pack(vals, dtype)
        hdr[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(blob)]}
        off += len(blob)
        blobs.append(blob)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


# ---- the tokenizer ----

def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def tokenizer_json(sequence):
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: i for i, b in enumerate(sorted(b2u, key=lambda b: ord(b2u[b])))}
    merges = [("\u0120", "t"), ("h", "e"), ("\u0120t", "he"), ("i", "n")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    assert len(vocab) == V
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": V - 1, "content": "<|endoftext|>", "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": True, "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [bl]} if sequence else bl,
        "post_processor": None if sequence else bl,
        "decoder": bl,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None if sequence else "",
                  "end_of_word_suffix": None if sequence else "", "fuse_unk": False,
                  "byte_fallback": False, "vocab": vocab,
                  # the two spellings of merges: newer pairs, older strings
                  "merges": [[a, b] for a, b in merges] if sequence
                  else ["%s %s" % m for m in merges]},
    }


# ---- maths ----

def matvec(w, x, rows, cols):
    """w row-major [rows, cols]: w @ x"""
    return [sum(w[r * cols + c] * x[c] for c in range(cols)) for r in range(rows)]


def vecmat(x, w, rows, cols):
    """x [rows] times w row-major [rows, cols] (Conv1D)"""
    return [sum(x[r] * w[r * cols + c] for r in range(rows)) for c in range(cols)]


def layernorm(x, w, b, eps):
    m = sum(x) / len(x)
    var = sum((v - m) ** 2 for v in x) / len(x)
    r = 1.0 / math.sqrt(var + eps)
    return [(v - m) * r * w[i] + b[i] for i, v in enumerate(x)]


def rmsnorm(x, w, eps):
    r = 1.0 / math.sqrt(sum(v * v for v in x) / len(x) + eps)
    return [v * r * w[i] for i, v in enumerate(x)]


def gelu_new(x):
    return 0.5 * x * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def silu(x):
    return x / (1.0 + math.exp(-x))


def attention(qs, ks, vs, nh, nkv, hd):
    """per position lists of [nh*hd] q, [nkv*hd] k and v; causal"""
    out = []
    for t in range(len(qs)):
        y = []
        for h in range(nh):
            g = h // (nh // nkv)
            q = qs[t][h * hd:(h + 1) * hd]
            sc = [sum(a * b for a, b in zip(q, ks[s][g * hd:(g + 1) * hd])) / math.sqrt(hd)
                  for s in range(t + 1)]
            m = max(sc)
            e = [math.exp(v - m) for v in sc]
            z = sum(e)
            y += [sum(e[s] / z * vs[s][g * hd + i] for s in range(t + 1)) for i in range(hd)]
        out.append(y)
    return out


def rope(x, pos, nheads, hd, theta):
    """HF rotate_half: x*cos + rotate_half(x)*sin, rotate_half = [-x2, x1]"""
    half, out = hd // 2, list(x)
    for h in range(nheads):
        for i in range(half):
            inv = 1.0 / theta ** (2 * i / hd)
            c, s = math.cos(pos * inv), math.sin(pos * inv)
            a, b = x[h * hd + i], x[h * hd + i + half]
            out[h * hd + i] = a * c - b * s
            out[h * hd + i + half] = b * c + a * s
    return out


# ---- GPT-2 ----

def gpt2(out, rng):
    C, L, NH, NPOS, EPS, DT = 16, 2, 2, 16, 1e-5, "F32"
    P = {}

    def t(name, shape, kind):
        n = 1
        for d in shape:
            n *= d
        mu, sd = (1.0, 0.2) if kind == "g" else (0.0, 0.1 if kind == "b" else 0.3)
        P[name] = (shape, [rounded(rng.gauss(mu, sd), DT) for _ in range(n)])

    t("wte.weight", [V, C], "w")
    t("wpe.weight", [NPOS, C], "w")
    for l in range(L):
        h = "h.%d." % l
        t(h + "ln_1.weight", [C], "g")
        t(h + "ln_1.bias", [C], "b")
        t(h + "attn.c_attn.weight", [C, 3 * C], "w")
        t(h + "attn.c_attn.bias", [3 * C], "b")
        t(h + "attn.c_proj.weight", [C, C], "w")
        t(h + "attn.c_proj.bias", [C], "b")
        t(h + "ln_2.weight", [C], "g")
        t(h + "ln_2.bias", [C], "b")
        t(h + "mlp.c_fc.weight", [C, 4 * C], "w")
        t(h + "mlp.c_fc.bias", [4 * C], "b")
        t(h + "mlp.c_proj.weight", [4 * C, C], "w")
        t(h + "mlp.c_proj.bias", [C], "b")
    t("ln_f.weight", [C], "g")
    t("ln_f.bias", [C], "b")
    p = {k: v[1] for k, v in P.items()}

    xs = [[p["wte.weight"][tok * C + i] + p["wpe.weight"][pos * C + i] for i in range(C)]
          for pos, tok in enumerate(TOKENS)]
    for l in range(L):
        h = "h.%d." % l
        qkv = [[a + b for a, b in zip(vecmat(layernorm(x, p[h + "ln_1.weight"], p[h + "ln_1.bias"], EPS),
                                             p[h + "attn.c_attn.weight"], C, 3 * C),
                                      p[h + "attn.c_attn.bias"])] for x in xs]
        ys = attention([r[:C] for r in qkv], [r[C:2 * C] for r in qkv], [r[2 * C:] for r in qkv],
                       NH, NH, C // NH)
        xs = [[a + b + c for a, b, c in zip(x, vecmat(y, p[h + "attn.c_proj.weight"], C, C),
                                            p[h + "attn.c_proj.bias"])] for x, y in zip(xs, ys)]
        nxt = []
        for x in xs:
            f = vecmat(layernorm(x, p[h + "ln_2.weight"], p[h + "ln_2.bias"], EPS),
                       p[h + "mlp.c_fc.weight"], C, 4 * C)
            f = [gelu_new(a + b) for a, b in zip(f, p[h + "mlp.c_fc.bias"])]
            nxt.append([a + b + c for a, b, c in zip(x, vecmat(f, p[h + "mlp.c_proj.weight"], 4 * C, C),
                                                     p[h + "mlp.c_proj.bias"])])
        xs = nxt
    logits = [matvec(p["wte.weight"], layernorm(x, p["ln_f.weight"], p["ln_f.bias"], EPS), V, C)
              for x in xs]

    tensors = [(k, s, v) for k, (s, v) in P.items()]
    # the causal-mask buffers hub files carry (not parameters)
    for l in range(L):
        tensors.append(("h.%d.attn.bias" % l, [1, 1, NPOS, NPOS],
                        [1.0 if j <= i else 0.0 for i in range(NPOS) for j in range(NPOS)]))
    os.makedirs(out, exist_ok=True)
    write_safetensors(os.path.join(out, "model.safetensors"), tensors, DT)
    cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": V,
           "n_embd": C, "n_layer": L, "n_head": NH, "n_positions": NPOS, "n_ctx": NPOS,
           "n_inner": None, "activation_function": "gelu_new", "layer_norm_epsilon": EPS,
           "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1,
           "scale_attn_weights": True, "bos_token_id": V - 1, "eos_token_id": V - 1,
           "torch_dtype": "float32"}
    return cfg, logits, tokenizer_json(False)


# ---- Llama ----

def filler(P, rng, dtype):
    """t(name, shape, kind): a tensor of gaussians into P (kind "g": a norm's
    gains around 1, else weights around 0), rounded to dtype"""
    def t(name, shape, kind):
        n = 1
        for d in shape:
            n *= d
        mu, sd = (1.0, 0.2) if kind == "g" else (0.0, 0.3)
        P[name] = (shape, [rounded(rng.gauss(mu, sd), dtype) for _ in range(n)])
    return t


def llama_attention(t, h, C, NH, NKV, HD):
    """a llama layer's norms and attention (HF names under h), in file order"""
    t(h + "input_layernorm.weight", [C], "g")
    t(h + "self_attn.q_proj.weight", [NH * HD, C], "w")
    t(h + "self_attn.k_proj.weight", [NKV * HD, C], "w")
    t(h + "self_attn.v_proj.weight", [NKV * HD, C], "w")
    t(h + "self_attn.o_proj.weight", [C, NH * HD], "w")
    t(h + "post_attention_layernorm.weight", [C], "g")


def llama(out, rng, dtype, tied, shards):
    C, L, NH, NKV, F, NPOS, EPS, THETA = 16, 2, 4, 2 if not tied else 4, 24, 16, 1e-5, 500000.0
    HD = C // NH
    P = {}
    t = filler(P, rng, dtype)
    t("model.embed_tokens.weight", [V, C], "w")
    for l in range(L):
        h = "model.layers.%d." % l
        llama_attention(t, h, C, NH, NKV, HD)
        t(h + "mlp.gate_proj.weight", [F, C], "w")
        t(h + "mlp.up_proj.weight", [F, C], "w")
        t(h + "mlp.down_proj.weight", [C, F], "w")
    t("model.norm.weight", [C], "g")
    if not tied:
        t("lm_head.weight", [V, C], "w")
    p = {k: v[1] for k, v in P.items()}

    xs = [p["model.embed_tokens.weight"][tok * C:(tok + 1) * C] for tok in TOKENS]
    for l in range(L):
        h = "model.layers.%d." % l
        n = [rmsnorm(x, p[h + "input_layernorm.weight"], EPS) for x in xs]
        qs = [rope(matvec(p[h + "self_attn.q_proj.weight"], v, NH * HD, C), pos, NH, HD, THETA)
              for pos, v in enumerate(n)]
        ks = [rope(matvec(p[h + "self_attn.k_proj.weight"], v, NKV * HD, C), pos, NKV, HD, THETA)
              for pos, v in enumerate(n)]
        vs = [matvec(p[h + "self_attn.v_proj.weight"], v, NKV * HD, C) for v in n]
        ys = attention(qs, ks, vs, NH, NKV, HD)
        xs = [[a + b for a, b in zip(x, matvec(p[h + "self_attn.o_proj.weight"], y, C, NH * HD))]
              for x, y in zip(xs, ys)]
        nxt = []
        for x in xs:
            m = rmsnorm(x, p[h + "post_attention_layernorm.weight"], EPS)
            g = matvec(p[h + "mlp.gate_proj.weight"], m, F, C)
            u = matvec(p[h + "mlp.up_proj.weight"], m, F, C)
            a = [silu(gi) * ui for gi, ui in zip(g, u)]
            nxt.append([xi + di for xi, di in zip(x, matvec(p[h + "mlp.down_proj.weight"], a, C, F))])
        xs = nxt
    head = p["model.embed_tokens.weight"] if tied else p["lm_head.weight"]
    logits = [matvec(head, rmsnorm(x, p["model.norm.weight"], EPS), V, C) for x in xs]

    os.makedirs(out, exist_ok=True)
    tensors = [(k, s, v) for k, (s, v) in P.items()]
    if shards:
        half = len(tensors) // 2
        parts = [tensors[:half], tensors[half:]]
        index = {"metadata": {"total_size": 0}, "weight_map": {}}
        for i, part in enumerate(parts):
            fname = "model-%05d-of-%05d.safetensors" % (i + 1, len(parts))
            write_safetensors(os.path.join(out, fname), part, dtype)
            for name, _, _ in part:
                index["weight_map"][name] = fname
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
            f.write("\n")
    else:
        write_safetensors(os.path.join(out, "model.safetensors"), tensors, dtype)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V,
           "hidden_size": C, "intermediate_size": F, "num_hidden_layers": L,
           "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": HD,
           "max_position_embeddings": NPOS, "rms_norm_eps": EPS, "rope_theta": THETA,
           "rope_scaling": None, "hidden_act": "silu", "attention_bias": False,
           "attention_dropout": 0.0, "mlp_bias": False, "pretraining_tp": 1,
           "tie_word_embeddings": tied, "bos_token_id": V - 1, "eos_token_id": V - 1,
           "torch_dtype": {"BF16": "bfloat16", "F16": "float16"}.get(dtype, "float32")}
    return cfg, logits, tokenizer_json(True)


# ---- Mixtral ----

def mixtral(out, rng):
    """MixtralForCausalLM: the llama attention, then per layer a router
    (block_sparse_moe.gate) whose softmax over all E experts picks the top K,
    the K weights renormalised to sum 1, each expert w2(silu(w1 x) * w3 x)."""
    C, L, NH, NKV, E, K, F, NPOS, EPS, THETA, DT = 16, 2, 4, 2, 4, 2, 12, 16, 1e-5, 1e6, "F32"
    HD = C // NH
    P = {}
    t = filler(P, rng, DT)
    t("model.embed_tokens.weight", [V, C], "w")
    for l in range(L):
        h = "model.layers.%d." % l
        llama_attention(t, h, C, NH, NKV, HD)
        t(h + "block_sparse_moe.gate.weight", [E, C], "w")
        for e in range(E):
            x = h + "block_sparse_moe.experts.%d." % e
            t(x + "w1.weight", [F, C], "w")
            t(x + "w2.weight", [C, F], "w")
            t(x + "w3.weight", [F, C], "w")
    t("model.norm.weight", [C], "g")
    t("lm_head.weight", [V, C], "w")
    p = {k: v[1] for k, v in P.items()}

    xs = [p["model.embed_tokens.weight"][tok * C:(tok + 1) * C] for tok in TOKENS]
    for l in range(L):
        h = "model.layers.%d." % l
        n = [rmsnorm(x, p[h + "input_layernorm.weight"], EPS) for x in xs]
        qs = [rope(matvec(p[h + "self_attn.q_proj.weight"], v, NH * HD, C), pos, NH, HD, THETA)
              for pos, v in enumerate(n)]
        ks = [rope(matvec(p[h + "self_attn.k_proj.weight"], v, NKV * HD, C), pos, NKV, HD, THETA)
              for pos, v in enumerate(n)]
        vs = [matvec(p[h + "self_attn.v_proj.weight"], v, NKV * HD, C) for v in n]
        ys = attention(qs, ks, vs, NH, NKV, HD)
        xs = [[a + b for a, b in zip(x, matvec(p[h + "self_attn.o_proj.weight"], y, C, NH * HD))]
              for x, y in zip(xs, ys)]
        nxt = []
        for x in xs:
            m = rmsnorm(x, p[h + "post_attention_layernorm.weight"], EPS)
            z = matvec(p[h + "block_sparse_moe.gate.weight"], m, E, C)
            mx = max(z)
            sm = [math.exp(v - mx) for v in z]
            sm = [v / sum(sm) for v in sm]
            top = sorted(range(E), key=lambda e: (-sm[e], e))[:K]
            wsum = sum(sm[e] for e in top)
            y = [0.0] * C
            for e in top:
                x_ = h + "block_sparse_moe.experts.%d." % e
                g = matvec(p[x_ + "w1.weight"], m, F, C)
                u = matvec(p[x_ + "w3.weight"], m, F, C)
                a = [silu(gi) * ui for gi, ui in zip(g, u)]
                d = matvec(p[x_ + "w2.weight"], a, C, F)
                y = [yi + sm[e] / wsum * di for yi, di in zip(y, d)]
            nxt.append([xi + yi for xi, yi in zip(x, y)])
        xs = nxt
    logits = [matvec(p["lm_head.weight"], rmsnorm(x, p["model.norm.weight"], EPS), V, C)
              for x in xs]

    os.makedirs(out, exist_ok=True)
    write_safetensors(os.path.join(out, "model.safetensors"),
                      [(k, s, v) for k, (s, v) in P.items()], DT)
    cfg = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": V,
           "hidden_size": C, "intermediate_size": F, "num_hidden_layers": L,
           "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": HD,
           "max_position_embeddings": NPOS, "rms_norm_eps": EPS, "rope_theta": THETA,
           "sliding_window": None, "hidden_act": "silu", "attention_dropout": 0.0,
           "num_local_experts": E, "num_experts_per_tok": K, "router_aux_loss_coef": 0.02,
           "output_router_logits": False, "router_jitter_noise": 0.0,
           "tie_word_embeddings": False, "bos_token_id": V - 1, "eos_token_id": V - 1,
           "torch_dtype": "float32"}
    return cfg, logits, tokenizer_json(True)


def finish(out, cfg, logits, tok):
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, indent=1, ensure_ascii=False)
        f.write("\n")
    with open(os.path.join(out, "expected.txt"), "w") as f:
        f.write("tokens: %s\n" % " ".join(map(str, TOKENS)))
        for row in logits:
            f.write(" ".join("%.9g" % v for v in row) + "\n")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: hf_fixture.py OUTDIR")
    root = sys.argv[1]
    rng = random.Random(17)
    d = os.path.join(root, "gpt2")
    finish(d, *gpt2(d, rng))
    d = os.path.join(root, "llama")
    finish(d, *llama(d, rng, "BF16", False, True))
    d = os.path.join(root, "llama-tied")
    finish(d, *llama(d, rng, "F16", True, False))
    d = os.path.join(root, "mixtral")  # its own generator: the others stay as they were
    finish(d, *mixtral(d, random.Random(28)))


if __name__ == "__main__":
    main()
