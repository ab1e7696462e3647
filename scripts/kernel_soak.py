"""A soak of one strata kernel through Jupyter: a set-up cell, then N cells (argv[1], 1000 by
default) of the small work a notebook repeats (a random tensor, a fused chain and a reduction
with their display, a matmul read back), reusing the same names as re-run cells do. Prints,
every 50 cells, the median seconds per cell over them and the resident memory (RSS) of the
kernel's processes together (the proxy, evcxr and the child that runs the cells), then a
last line comparing the first and last 100 cells. Uses the installed `strata` kernelspec
(`strata-jupyter install`); STRATA_DEVICE picks the device, as in a notebook."""
import os
import statistics
import sys
import tempfile
import time

import jupyter_client

# The control (argv[2] `plain`): the same kind of cells without strata, to tell what the
# kernel itself (evcxr: each cell is a crate built and loaded into the process) holds per cell.
PLAIN = [
    "let t: Vec<f32> = (0..65536).map(|i| i as f32).collect();",
    "let s: f32 = t.iter().map(|v| (v * 2.0).max(0.0)).sum();\ns",
    "t.iter().take(256).sum::<f32>()",
]
CELLS = [
    "let t = Tensor::rand([256, 256], DType::F32, &mut g, &dev)?;",
    "let s = (&t * 2.0)?.relu()?.sum(-1, false)?;\ns",
    "t.matmul(&t)?.mean(Axes::All, false)?.item::<f32>()?",
]


def tree_rss_mib(root, each=None):
    """The RSS of `root` and all its descendants, in MiB (from /proc); `each` gets
    (command, MiB) for every process."""
    children = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(pid))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("Name:"):
                        name = line.split()[1]
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
                        if each is not None:
                            each.append((name, int(line.split()[1]) / 1024))
        except OSError:
            pass
    return total / 1024


def run(kc, code):
    """Runs one cell; raises on an error reply."""
    errors = []

    def hook(msg):
        if msg["msg_type"] == "error":
            errors.append("\n".join(msg["content"]["traceback"]))

    reply = kc.execute_interactive(code, timeout=600, output_hook=hook)
    if reply["content"]["status"] != "ok" or errors:
        raise SystemExit(f"cell failed: {code!r}: {errors}")


def main(n, cells):
    os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="xdg-"))
    km, kc = jupyter_client.manager.start_new_kernel(kernel_name="strata", startup_timeout=3600)
    pid = km.provisioner.process.pid
    try:
        if cells is CELLS:
            run(kc, "let dev = Device::auto()?;\nlet mut g = strata::random::Generator::new(1);")
        times, rss = [], []
        for i in range(n):
            began = time.monotonic()
            run(kc, cells[i % len(cells)])
            times.append(time.monotonic() - began)
            if (i + 1) % 50 == 0:
                rss.append(tree_rss_mib(pid))
                window = times[-50:]
                print(f"cells {i - 48:5d}-{i + 1:5d}: median {statistics.median(window):.3f} s a cell, "
                      f"RSS {rss[-1]:.0f} MiB", flush=True)
        head, tail = times[:100], times[-100:]
        print(f"{n} cells: median {statistics.median(head):.3f} s a cell over the first 100, "
              f"{statistics.median(tail):.3f} s over the last 100; RSS {rss[0]:.0f} MiB after 50 "
              f"cells, {rss[-1]:.0f} MiB at the end, {max(rss):.0f} MiB at most", flush=True)
        each = []
        tree_rss_mib(pid, each)
        print("by process: " + ", ".join(f"{name} {mib:.0f} MiB" for name, mib in each), flush=True)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000,
     PLAIN if len(sys.argv) > 2 and sys.argv[2] == "plain" else CELLS)
