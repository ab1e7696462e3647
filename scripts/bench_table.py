"""Joins the JSON lines of bench_cuda and bench_torch.py into BENCHMARKS.md's table."""
import json
import sys


def load(path):
    rows = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                r = json.loads(line)
                rows[r["op"]] = r
    return rows


def rate(r):
    if r.get("flops"):
        return f"{r['flops'] / r['ms'] / 1e9:,.1f} TFLOP/s"
    if r.get("bytes"):
        return f"{r['bytes'] / r['ms'] / 1e6:,.0f} GB/s"
    return ""


def main():
    s, t = load(sys.argv[1]), load(sys.argv[2])
    print("| op (2^28 f32 unless named) | strata | | PyTorch | | strata / PyTorch |")
    print("|---|---:|---:|---:|---:|---:|")
    for op, r in s.items():
        if "ms" not in r:
            continue
        p = t.get(op)
        ratio = f"{p['ms'] / r['ms']:.2f}x" if p else ""
        pms = f"{p['ms']:.3f} ms" if p else ""
        print(f"| {op} | {r['ms']:.3f} ms | {rate(r)} | {pms} | {rate(p) if p else ''} | {ratio} |")
    if "host-us-per-add" in s:
        a, b = s["host-us-per-add"]["us"], t.get("host-us-per-add", {}).get("us")
        ratio = f"{b / a:.2f}x" if b else ""
        print(f"| host cost of a 1-element add | {a:.2f} us | | {b:.2f} us | | {ratio} |")
    for k in ("first-op-cold", "first-op-warm"):
        if k in s:
            r = s[k]
            print(f"| {k}: context / first add+sum+read | {r['context_ms']:.0f} ms / {r['first_ops_ms']:.0f} ms | | | | |")


if __name__ == "__main__":
    main()
