"""Starts a Jupyter kernel, runs each argument as a cell, and prints how long each took.

Used by `strata-jupyter install` to warm evcxr's build cache, and by scripts/notebook-timing.sh
to measure a fresh kernel. Exits with 1 when a cell reports an error (on stderr, as evcxr does
for `?`) or the kernel does not start.
"""
import os
import sys
import tempfile
import time

import jupyter_client


def main(kernel, cells):
    # Without it libwayland, probed by the Vulkan driver, prints an error line into cell output.
    os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="xdg-"))
    start = time.monotonic()
    km, kc = jupyter_client.manager.start_new_kernel(kernel_name=kernel, startup_timeout=3600)
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
        km.shutdown_kernel(now=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
