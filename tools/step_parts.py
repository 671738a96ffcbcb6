#!/usr/bin/env python3
"""tools/step_parts.py NCU_CSV STEPS TORCH_CSV - a step's GPU time by part,
asyncpp beside PyTorch.

NCU_CSV is what tools/gpu-check's profile step wrote (ncu's
gpu__time_duration.sum of every launch of STEPS steps of asyncpp's
default GPT-2 step: one warm-up and one timed); TORCH_CSV is what
`tools/torch_gpt2_bench.py --profile-csv` wrote (kernel,ms_per_step from
torch.profiler over the same shape). Every kernel goes to the first part
whose pattern finds its name (PARTS below: attention before the matrix
products, since fused attention kernels carry gemm in their names), and
the table gives each part's milliseconds per step and share of the step's
kernel time for both, so the next gap shows without reading kernel lists.
torch.compile's Triton kernels (triton_*) go by what their names say
(layer_norm, softmax, ...); the rest form a part of their own.
"""
import csv
import re
import sys

from ncu_summary import UNIT, rows

PARTS = [
    ("attention", r"flash|fmha|sdpa|attention|attn|mha"),
    ("matmul (cuBLAS, CUTLASS)", r"gemm|nvjet|xmma|cutlass|cublas|sm\d+_"),
    ("layernorm", r"layernorm|layer_norm|rmsnorm|rms_norm|\bln_"),
    ("loss (softmax, cross-entropy)", r"xent|cross_entropy|softmax|nll"),
    ("optimizer, clip, norm", r"adam|optim|multi_tensor|foreach|clip|norm_sq|sumsq|grad_norm|muon|newton"),
    ("embedding", r"embed|encoder|wte|wpe|index_select|indexing"),
    ("fused (triton)", r"^triton_"),
    ("elementwise, copies", r"gelu|swiglu|elementwise|vectorized|add|copy|cast|convert|fill|bf16|scale|zero|memset|reduce"),
]


def part_of(name):
    low = name.lower()
    for part, pat in PARTS:
        if re.search(pat, low):
            return part
    return "other"


def ncu_ms(path):
    """kernel name -> total ms over the run"""
    out = {}
    for r in rows(path):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = UNIT.get(r.get("Metric Unit", ""))
        if unit is None:
            sys.exit("step_parts: unknown unit %r in %s" % (r.get("Metric Unit"), path))
        name = r["Kernel Name"]
        out[name] = out.get(name, 0.0) + float(r["Metric Value"].replace(",", "")) * unit
    return out


def torch_ms(path):
    """kernel name -> ms per step"""
    out = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            out[r["kernel"]] = out.get(r["kernel"], 0.0) + float(r["ms_per_step"])
    return out


def by_part(ms):
    parts = {}
    for name, v in ms.items():
        p = part_of(name)
        parts[p] = parts.get(p, 0.0) + v
    return parts


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: tools/step_parts.py NCU_CSV STEPS TORCH_CSV")
    steps = float(sys.argv[2])
    if steps <= 0:
        sys.exit("step_parts: STEPS must be positive")
    ours = {k: v / steps for k, v in by_part(ncu_ms(sys.argv[1])).items()}
    theirs = by_part(torch_ms(sys.argv[3]))
    if not ours or not theirs:
        sys.exit("step_parts: no kernel time in %s" % (sys.argv[1] if not ours else sys.argv[3]))
    t_ours, t_theirs = sum(ours.values()), sum(theirs.values())
    print("%-30s %12s %6s %12s %6s" % ("part", "asyncpp ms", "share", "PyTorch ms", "share"))
    order = [p for p, _ in PARTS] + ["other"]
    for p in sorted(order, key=lambda p: -max(ours.get(p, 0.0), theirs.get(p, 0.0))):
        a, b = ours.get(p, 0.0), theirs.get(p, 0.0)
        if a == 0.0 and b == 0.0:
            continue
        print("%-30s %12.3f %5.1f%% %12.3f %5.1f%%" % (p, a, 100 * a / t_ours, b,
                                                      100 * b / t_theirs))
    print("%-30s %12.3f %5.1f%% %12.3f %5.1f%%" % ("all kernels (per step)", t_ours, 100.0,
                                                  t_theirs, 100.0))


if __name__ == "__main__":
    main()
