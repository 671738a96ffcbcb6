#!/usr/bin/env python3
"""torch_gpt2_bench.py - the GPT-2 124M training step in plain PyTorch.

The figure a user would otherwise pick: bf16 autocast, fused AdamW,
torch.compile (when it works here), flash scaled-dot-product attention,
random tokens. Prints tokens/s, MFU and peak device memory with the FLOP
formula that `asyncpp bench train` prints:

    FLOPs/token = 6 * (parameters - position embedding) + 6 * L * C * T

so tools/gpu-check can put the two side by side from the same call.
Peak FLOP/s defaults to 989e12 (H100/H200 dense bf16), as asyncpp's.

    python3 tools/torch_gpt2_bench.py [--batch 16] [--seq 1024] [--steps 20]
        [--warmup 5] [--no-compile] [--csv FILE] [--profile-csv FILE]

--profile-csv: after the timed steps, torch.profiler records 3 more and
FILE gets each CUDA kernel's device milliseconds per step (kernel,
ms_per_step), which tools/step_parts.py sets beside asyncpp's ncu profile.
"""
import argparse
import csv
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln1 = nn.LayerNorm(C)
        self.attn = nn.Linear(C, 3 * C)
        self.attn_proj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C)
        self.fc = nn.Linear(C, 4 * C)
        self.fc_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.attn(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, V, T, L, C, NH):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.lnf = nn.LayerNorm(C)
        self.head = nn.Linear(C, V, bias=False)
        self.head.weight = self.wte.weight  # tied, as GPT-2
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.lnf(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50304, help="padded, as asyncpp pads 50257")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--peak", type=float, default=989e12)
    ap.add_argument("--csv", default="")
    ap.add_argument("--profile-csv", default="")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("torch_gpt2_bench: no CUDA device")
    dev = "cuda"
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    model = GPT2(a.vocab, a.seq, a.layers, a.width, a.heads).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    flops_tok = 6.0 * (n_params - model.wpe.weight.numel()) + 6.0 * a.layers * a.width * a.seq
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    compiled = "no"
    step_model = model
    if not a.no_compile:
        try:
            step_model = torch.compile(model)
            compiled = "yes"
        except Exception as e:  # noqa: BLE001 - report and go on uncompiled
            print(f"torch.compile unavailable: {e}", file=sys.stderr)
    x = torch.randint(0, 50257, (a.batch, a.seq), device=dev)
    y = torch.randint(0, 50257, (a.batch, a.seq), device=dev)

    def step():
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = step_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    try:
        for _ in range(a.warmup):
            step()
    except Exception as e:  # noqa: BLE001 - compile failures surface at the first call
        if compiled != "yes":
            raise
        print(f"torch.compile failed, running eager: {e}", file=sys.stderr)
        step_model, compiled = model, "failed"
        for _ in range(a.warmup):
            step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(a.steps):
        loss = step()
    end.record()
    torch.cuda.synchronize()
    sec = start.elapsed_time(end) / 1e3
    tps = a.batch * a.seq * a.steps / sec
    mfu = tps * flops_tok / a.peak
    peak_mb = torch.cuda.max_memory_allocated() / 2**20
    print(f"torch gpt2: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"compile {compiled}, params {n_params}, B {a.batch} T {a.seq}")
    print(f"torch gpt2: {tps:.0f} tokens/s, {1e3 * sec / a.steps:.1f} ms/step, "
          f"MFU {100 * mfu:.1f}%, peak memory {peak_mb:.0f} MiB, loss {loss.item():.3f}")
    if a.csv:
        with open(a.csv, "w") as f:
            f.write("tokens_per_s,ms_per_step,mfu,peak_mib,compile\n")
            f.write(f"{tps:.1f},{1e3 * sec / a.steps:.3f},{mfu:.4f},{peak_mb:.0f},{compiled}\n")
    if a.profile_csv:
        profile_steps(step, 3, a.profile_csv)
    if not math.isfinite(loss.item()):
        sys.exit("torch_gpt2_bench: non-finite loss")


def profile_steps(step, n, path):
    """n steps under torch.profiler: every CUDA kernel's device time per step"""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        # device kernels only; the attribute's name changed across versions
        us = getattr(e, "self_device_time_total", None)
        if us is None:
            us = getattr(e, "self_cuda_time_total", 0)
        dev = str(getattr(e, "device_type", ""))
        if us > 0 and "CUDA" in dev.upper():
            rows.append((e.key, us / 1e3 / n))
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kernel", "ms_per_step"])
        for k, ms in sorted(rows, key=lambda r: -r[1]):
            w.writerow([k, "%.6f" % ms])


if __name__ == "__main__":
    main()
