"""Starts a Jupyter kernel, runs each argument as a cell, and prints how long each took.

Used by `strata-jupyter install` to warm evcxr's build cache, and by scripts/notebook-timing.sh
to measure a fresh kernel. Exits with 1 when a cell reports an error (on stderr, as evcxr does
for `?`) or the kernel does not start.
"""
import os
import sys
import tempfile
import threading
import time

import jupyter_client

# A line at least this often while the kernel builds, so a long first build is not silent.
PROGRESS_EVERY_S = 30


def last_build_step(log_path):
    """The last `Compiling …` line of the kernel's log (what cargo is building), or ''."""
    try:
        with open(log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    steps = [line.strip() for line in lines if line.strip().startswith("Compiling ")]
    return steps[-1] if steps else ""


def progress_line(elapsed_s, step):
    """What the progress thread prints: the time so far and what is being built."""
    doing = f": {step}" if step else ""
    return f"  ... {elapsed_s:.0f} s{doing}"


def report_progress(log_path, start, done):
    """Prints a progress line every PROGRESS_EVERY_S seconds until `done` is set."""
    while not done.wait(PROGRESS_EVERY_S):
        print(progress_line(time.monotonic() - start, last_build_step(log_path)), flush=True)


def kernel_log(kernel):
    """The kernel's log beside its kernelspec (where evcxr writes cargo's lines)."""
    try:
        spec = jupyter_client.kernelspec.KernelSpecManager().get_kernel_spec(kernel)
        return os.path.join(spec.resource_dir, "kernel.log")
    except Exception:
        return ""


def main(kernel, cells):
    # Without it libwayland, probed by the Vulkan driver, prints an error line into cell output.
    os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="xdg-"))
    start = time.monotonic()
    done = threading.Event()
    threading.Thread(target=report_progress, args=(kernel_log(kernel), start, done),
                     daemon=True).start()
    try:
        km, kc = jupyter_client.manager.start_new_kernel(kernel_name=kernel, startup_timeout=3600)
    except BaseException:
        done.set()
        raise
    print(f"kernel ready after {time.monotonic() - start:.1f} s", flush=True)
    failed = False
    try:
        for code in cells:
            began = time.monotonic()
            texts = []

            def hook(msg):
                content = msg["content"]
                if msg["msg_type"] == "stream":
                    texts.append((content["name"], content["text"]))
                elif msg["msg_type"] == "error":
                    texts.append(("stderr", "\n".join(content["traceback"])))

            reply = kc.execute_interactive(code, timeout=3600, output_hook=hook)
            took = time.monotonic() - began
            errors = [t for name, t in texts if name == "stderr"]
            if reply["content"]["status"] != "ok" or errors:
                failed = True
                print(f"cell failed after {took:.1f} s: {code!r}\n{''.join(errors)}", flush=True)
            else:
                print(f"cell answered after {took:.2f} s: {code!r}", flush=True)
    finally:
        done.set()
        km.shutdown_kernel(now=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
