"""Joins the sweep benchmark's outputs into one markdown table: op, strata on CUDA, PyTorch,
speed ratio (PyTorch's time over strata's: above 1 means strata is faster), and strata on wgpu
when that file is given. Usage: bench_sweep_table.py strata.jsonl torch.jsonl [wgpu.jsonl]"""
import json
import sys


def load(path):
    rows = {}
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    r = json.loads(line)
                    rows[r["op"]] = r.get("ms")
    except FileNotFoundError:
        pass
    return rows


def fmt(ms):
    return "" if ms is None else (f"{ms:,.3f}" if ms < 100 else f"{ms:,.0f}")


def main():
    strata, torch = load(sys.argv[1]), load(sys.argv[2])
    wgpu = load(sys.argv[3]) if len(sys.argv) > 3 else {}
    head = "| op | strata CUDA (ms) | PyTorch (ms) | PyTorch / strata |"
    rule = "|---|---:|---:|---:|"
    if wgpu:
        head += " strata wgpu (ms) |"
        rule += "---:|"
    print(head)
    print(rule)
    ops = list(strata) + [op for op in torch if op not in strata]
    for op in ops:
        s, t = strata.get(op), torch.get(op)
        ratio = f"{t / s:.2f}×" if s and t else ""
        line = f"| {op} | {fmt(s)} | {fmt(t)} | {ratio} |"
        if wgpu:
            line += f" {fmt(wgpu.get(op))} |"
        print(line)


if __name__ == "__main__":
    main()
