#!/usr/bin/env python3
"""tools/ncu_summary.py [--match REGEX] CSV [STEPS] - where a GPU step's time goes.

Reads what `ncu --metrics gpu__time_duration.sum --csv` printed for a run
(tools/gpu-check's profile step: bench train, one warm-up and one timed
step) and prints the kernels by total GPU time: launches, milliseconds, share
of all kernel time, and milliseconds per step when STEPS is given. Kernels
of one name (templates and cuBLASLt's included) are summed together. Lines
that are not ncu's CSV (the program's own output, ==PROF== notes) are
skipped. --match REGEX adds a last line with the milliseconds and share of
the kernels whose names REGEX finds (tools/gpu-check: the MoE routing and
dispatch kernels' share of an MoE step).
"""
import csv
import re
import sys

UNIT = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3,
        "ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}


def rows(path):
    with open(path, newline="", errors="replace") as f:
        lines = [ln for ln in f if ln.startswith('"')]
    return csv.DictReader(lines)


def short(name, width=72):
    # templates and argument lists make names long: keep the head
    name = name.split("(")[0]
    return name if len(name) <= width else name[: width - 3] + "..."


def main():
    args = sys.argv[1:]
    match = None
    if args[:1] == ["--match"] and len(args) >= 2:
        match = re.compile(args[1])
        args = args[2:]
    if not args:
        sys.exit("usage: tools/ncu_summary.py [--match REGEX] CSV [STEPS]")
    sys.argv = [sys.argv[0]] + args
    steps = float(sys.argv[2]) if len(sys.argv) > 2 else 0
    total, count = {}, {}
    for r in rows(sys.argv[1]):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = UNIT.get(r.get("Metric Unit", ""), None)
        if unit is None:
            sys.exit("ncu_summary: unknown unit %r" % r.get("Metric Unit"))
        ms = float(r["Metric Value"].replace(",", "")) * unit
        k = short(r["Kernel Name"])
        total[k] = total.get(k, 0.0) + ms
        count[k] = count.get(k, 0) + 1
    if not total:
        sys.exit("ncu_summary: no gpu__time_duration rows in %s" % sys.argv[1])
    all_ms = sum(total.values())
    print("%-72s %8s %10s %6s%s" % ("kernel", "launches", "ms", "share",
                                    "   ms/step" if steps else ""))
    for k in sorted(total, key=total.get, reverse=True)[:40]:
        print("%-72s %8d %10.3f %5.1f%%%s" % (k, count[k], total[k], 100 * total[k] / all_ms,
                                              "   %7.3f" % (total[k] / steps) if steps else ""))
    print("all kernels: %d launches, %.3f ms%s" % (
        sum(count.values()), all_ms, ", %.3f ms per step" % (all_ms / steps) if steps else ""))
    if match:
        ms = sum(t for k, t in total.items() if match.search(k))
        print("matching %s: %.3f ms, %.1f%% of all kernels" % (match.pattern, ms,
                                                             100 * ms / all_ms))


if __name__ == "__main__":
    main()
