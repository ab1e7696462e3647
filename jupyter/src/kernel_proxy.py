"""The strata kernel's front door: Jupyter's sockets, held by libzmq, in front of evcxr_jupyter.

Usage: python kernel_proxy.py CONNECTION_FILE LOG_FILE EVCXR_JUPYTER

Why: evcxr_jupyter 0.22 speaks ZeroMQ through the pure-Rust `zeromq` crate, and two of its
behaviours hang or half-kill a kernel (issue 18, both reproduced with jupyter_client):
- its PUB socket waits until every subscriber's connection has taken each message, so one
  IOPub subscriber that stops reading (a stalled client, a socket left open and unread) blocks
  every publish, and with it every reply: the kernel hangs for all clients at once;
- its heartbeat (REP) loop ends at the first client that goes away mid-request, after which
  the heartbeat never answers again.
libzmq, which every Jupyter client uses, drops IOPub messages for a subscriber that lags past
its queue instead of waiting, and serves heartbeats per connection. So libzmq binds the IOPub
and heartbeat ports the frontend knows, and evcxr publishes and answers heartbeats through one
private connection each, which this proxy always reads at once. Shell, control and stdin stay
evcxr's own: their requests and replies carry the clients' identities, whose reconnects
evcxr's ROUTER handles (the newest connection of an identity wins and the old one is closed,
so a client that shares its identity reconnects), which libzmq's ROUTER does not.

The proxy forwards every message unchanged (they are signed end to end), starts evcxr with a
connection file of private ports, writes evcxr's output to LOG_FILE (so `jupyter console`
stays quiet), and exits with evcxr's exit status.

evcxr builds each kernel's crates in a fresh temporary directory (about 400 MB with strata)
and removes it only when it exits normally; a kernel killed by its manager (Jupyter's
"shut down now", a restart) left it behind, and a machine that ran many kernels filled its
disk. Each kernel now gets its own temporary directory, `strata-kernel-<proxy pid>`, removed
when the kernel ends, and every new kernel first removes those of kernels that no longer run.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

import zmq


def free_ports(ip, count):
    """`count` TCP ports free on `ip` right now (evcxr binds them a moment later)."""
    holders, ports = [], []
    for _ in range(count):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind((ip, 0))
        holders.append(s)
        ports.append(s.getsockname()[1])
    for s in holders:
        s.close()
    return ports


TEMP_PREFIX = "strata-kernel-"


def is_live_proxy(pid):
    """True when `pid` runs a kernel proxy (a reused pid of another program is not one)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"kernel_proxy" in f.read()
    except OSError:
        if sys.platform.startswith("linux"):
            return False
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False


def remove_dead_kernels_dirs(base):
    """Removes the temporary directories of kernels whose proxy no longer runs."""
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        pid = name[len(TEMP_PREFIX):]
        if name.startswith(TEMP_PREFIX) and pid.isdigit() and not is_live_proxy(int(pid)):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)


def die_with_parent():
    """In the child: SIGKILL when the proxy dies, whatever kills it (Linux only)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def main(connection_file, log_file, evcxr):
    with open(connection_file) as f:
        front = json.load(f)
    transport = front.get("transport", "tcp")
    if transport != "tcp":
        # Nothing to fix for other transports: run evcxr as it is.
        log = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.execv(evcxr, [evcxr, "--control_file", connection_file])

    # evcxr binds shell, control and stdin where the frontend expects them; IOPub and the
    # heartbeat move to private ports behind this proxy.
    back = dict(front)
    back["iopub_port"], back["hb_port"] = free_ports(front["ip"], 2)
    back_file = f"{connection_file}.evcxr-{os.getpid()}.json"
    with open(back_file, "w") as f:
        json.dump(back, f)

    ctx = zmq.Context()

    def url(info, name):
        return f"tcp://{info['ip']}:{info[f'{name}_port']}"

    # The heartbeat: clients' REQ sockets → this ROUTER → one DEALER → evcxr's REP. The
    # DEALER queues pings until evcxr listens, without a limit that could block the proxy.
    hb_front = ctx.socket(zmq.ROUTER)
    hb_front.setsockopt(zmq.LINGER, 0)
    hb_front.bind(url(front, "hb"))
    hb_back = ctx.socket(zmq.DEALER)
    hb_back.setsockopt(zmq.LINGER, 0)
    hb_back.setsockopt(zmq.SNDHWM, 0)
    hb_back.connect(url(back, "hb"))
    # IOPub: evcxr's PUB → this SUB (always read) → a libzmq PUB that drops for laggards.
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(url(front, "iopub"))
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(url(back, "iopub"))

    # Interrupts arrive as messages (interrupt_mode "message"); a terminal's Ctrl-C on the
    # whole process group must not stop the proxy.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    log = open(log_file, "ab")
    base = tempfile.gettempdir()
    remove_dead_kernels_dirs(base)
    own_temp = os.path.join(base, f"{TEMP_PREFIX}{os.getpid()}")
    os.makedirs(own_temp, exist_ok=True)
    child = subprocess.Popen(
        [evcxr, "--control_file", back_file],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        env=dict(os.environ, TMPDIR=own_temp),
        preexec_fn=die_with_parent if sys.platform.startswith("linux") else None,
    )

    def end_child_and_clean_up():
        """Stops evcxr if it still runs (SIGTERM, then SIGKILL after 5 s), then removes the
        private connection file and the kernel's temporary directory."""
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        for remove in (lambda: os.remove(back_file), lambda: shutil.rmtree(own_temp)):
            try:
                remove()
            except OSError:
                pass

    def stop(signum, _frame):
        end_child_and_clean_up()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)

    pairs = {hb_front: hb_back, hb_back: hb_front, sub: pub}
    poller = zmq.Poller()
    for s in pairs:
        poller.register(s, zmq.POLLIN)
    try:
        while child.poll() is None:
            for s, _ in poller.poll(200):
                # Everything waiting on this socket, without blocking.
                while True:
                    try:
                        frames = s.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    pairs[s].send_multipart(frames, copy=False)
    finally:
        end_child_and_clean_up()
    return child.returncode


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    sys.exit(main(*sys.argv[1:]))
