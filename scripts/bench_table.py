"""Joins the JSON lines of bench_gpu and bench_torch.py into BENCHMARKS.md's table. With one
file (a wgpu run, nothing to compare with) each row is set against the copy's bandwidth."""
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
        tf = r["flops"] / r["ms"] / 1e9
        return f"{tf:,.1f} TFLOP/s" if tf >= 0.1 else f"{tf * 1e3:,.2f} GFLOP/s"
    if r.get("bytes"):
        gb = r["bytes"] / r["ms"] / 1e6
        return f"{gb:,.0f} GB/s" if gb >= 100 else f"{gb:,.2f} GB/s"
    return ""


def alone(s):
    copy = s.get("copy")
    print("| op (f32) | ms | rate | × copy bandwidth |")
    print("|---|---:|---:|---:|")
    for op, r in s.items():
        if "ms" not in r:
            continue
        frac = ""
        if copy and r.get("bytes"):
            frac = f"{(r['bytes'] / r['ms']) / (copy['bytes'] / copy['ms']):.2f}x"
        print(f"| {op} | {r['ms']:.3f} | {rate(r)} | {frac} |")
    if "host-us-per-add" in s:
        h = s["host-us-per-add"]
        print(f"| 1-element add, enqueue cost (bursts of 200) | {h['us']:.2f} us | | |")
        print(f"| 1-element add, sustained (20,000, one sync) | {h['sustained_us']:.2f} us | | |")
        if "recorded_us" in h:
            print(f"| recording one elementwise op (lazy fusion) | {h['recorded_us']:.2f} us | | |")
        if "recorded_dropped_us" in h:
            print(f"| recording alone (chains of 50 dropped unread) | {h['recorded_dropped_us']:.2f} us | | |")


def main():
    if len(sys.argv) < 3:
        return alone(load(sys.argv[1]))
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
    for op, p in t.items():
        if op not in s and "ms" in p:
            print(f"| {op} (PyTorch only) | | | {p['ms']:.3f} ms | {rate(p)} | |")
    for op, p in t.items():
        if op.startswith("compile-"):
            what = f"{p['first_ms']:.0f} ms" if "first_ms" in p else p.get("error", "")
            print(f"| torch.{op} | | | {what} | | |")
    for op, prefix in (("host-us-per-add", ""), ("unbatched-host-us-per-add", "unbatched: ")):
        if op not in s:
            continue
        for key, what in (("us", "host cost of a 1-element add (enqueue, bursts of 200)"),
                          ("alternating_us", "the same, adds and multiplies alternating"),
                          ("sustained_us", "sustained rate of 1-element adds (20,000, one sync)"),
                          ("recorded_us", "recording one elementwise op (lazy fusion, chains of 200)"),
                          ("recorded_dropped_us", "recording alone (chains of 50 dropped unread)")):
            a, b = s[op].get(key), t.get("host-us-per-add", {}).get(key)
            if a is None:
                continue
            ratio = f"{b / a:.2f}x" if b else ""
            pb = f"{b:.2f} us" if b else ""
            print(f"| {prefix}{what} | {a:.2f} us | | {pb} | | {ratio} |")
    if "host-profiled" in s:
        r = s["host-profiled"]
        print(f"| the same adds while a profile records ({r['records']} records) | {r['us']:.2f} us | | | | |")
    for op in ("host-parts", "unbatched-host-parts"):
        if op in s:
            r = s[op]
            print(f"| {op}: add into an existing output / add on the CPU device | "
                  f"{r['add_out_us']:.2f} us / {r['cpu_device_us']:.2f} us | | | | |")
    for k in ("first-op-cold", "first-op-warm"):
        if k in s:
            r = s[k]
            print(f"| {k}: context / first add+sum+read / first new fused kernel | {r['context_ms']:.0f} ms / "
                  f"{r['first_ops_ms']:.0f} ms / {r.get('first_fused_ms', 0):.0f} ms | | | | |")
            if "second_fused_ms" in r:
                print(f"| {k}: a second new fused kernel, of which compiling | {r['second_fused_ms']:.0f} ms / "
                      f"{r['second_fused_compile_ms']:.0f} ms | | | | |")


if __name__ == "__main__":
    main()
