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
private connection each, which this proxy always reads at once. Shell and stdin pass through
the proxy too (to renumber execution counts), on a ROUTER of its own (zmtp_router.py): their
clients' identities are shared and reused, and only evcxr's rule for that (the newest
connection of an identity wins, the old one is closed and reconnects) keeps every client
talking; libzmq's ROUTER cannot do it. Control stays evcxr's own.

The proxy forwards every message unchanged (they are signed end to end) but these, signed
again with the connection's key (issue 43): every message about a cell carries the proxy's
execution count (evcxr 0.22 numbered a kernel's first cell 2 and counted silent cells;
ExecutionCounts); evcxr's error when the process that runs cells ended (an interrupt kills
it; it said only "Subprocess terminated with status: signal: 9 (SIGKILL)", and the next cell
"cannot find value") becomes one line that says what happened and what survives; and a cell
that ends in an op's Result without `?` (shown through Debug as `Ok(Tensor { … })`) gets a
line saying to add `?`. It starts evcxr with a connection file of private ports (outside the
range Jupyter draws a kernel's ports from, so kernels started together never take each other's;
started again on others if one was taken anyway), writes evcxr's output to LOG_FILE (so
`jupyter console` stays quiet; the proxy's own failure goes there too), and exits with evcxr's
exit status.

evcxr builds each kernel's crates in a fresh temporary directory (about 400 MB with strata)
and removes it only when it exits normally; a kernel killed by its manager (Jupyter's
"shut down now", a restart) left it behind, and a machine that ran many kernels filled its
disk. Each kernel now gets its own temporary directory, `strata-kernel-<proxy pid>`, removed
when the kernel ends, and every new kernel first removes those of kernels that no longer run.
evcxr's crate lives in its `crate` subdirectory (EVCXR_TMPDIR).

The kernel builds strata with the repository's locked versions (STRATA_KERNEL_SOURCE:
`git:DIR` for its committed HEAD's Cargo.lock, `path:DIR` for the working tree's), so notebooks
run what the tests ran. evcxr's crate cannot simply start from that lockfile: evcxr builds an
empty crate first (which prunes it) and resolves each `:dep` afresh, taking the newest
versions. So the kernel depends on a "pins" crate besides strata, which requires exactly the
locked version of every registry package in strata's build for this machine (worked out once
per lockfile with `cargo metadata`, offline where it can; kept under
~/.cache/strata-kernel-pins).

evcxr's build cache (`:cache`, ~/.cache/evcxr) is not safe across processes: a cache hit
rewrites the entry's `hits` file, and a kernel reading it at that moment fails to parse it and
its build of strata fails (issue 43: JupyterLab restoring two notebooks lost one kernel in
four). Each kernel's builds use a private copy instead: hard links to the shared entries, its
own `hits` files. It reaches the builds alone (`:build_env XDG_CACHE_HOME=…` at the top of a
per-kernel copy of the configuration, EVCXR_CONFIG_DIR), so the user's code keeps the caches
it shares (strata's compiled CUDA kernels, Mesa's shaders). The entries a kernel builds move
to the shared cache when it ends (a rename: whole or not at all; a killed kernel's, when the
next one starts), where evcxr trims the cache to its limit as before.
"""

import hashlib
import hmac
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

import zmq

from zmtp_router import Router


def ephemeral_range():
    """The ports the system hands out for a bind to port 0 (Linux's setting; 32768-65535,
    which covers Linux's, macOS's and Windows's defaults, elsewhere)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 65535


def free_ports(ip, count, attempts=2000):
    """`count` TCP ports free on `ip` right now (evcxr binds them a moment later), chosen
    outside the ephemeral range.

    Jupyter picks a kernel's ports by binding port 0 and closing the socket, so until the
    kernel binds them they look free. Ports taken the same way here could be those of a kernel
    started at the same moment (four kernels started together lost one: the ports another
    proxy gave its evcxr were the ones Jupyter had just picked for it). Ports below the
    ephemeral range are never handed out by a bind to port 0."""
    import random

    low, high = ephemeral_range()
    below = (max(1024, low - 16384), low) if low - 1024 >= 4096 else None
    above = (high + 1, 65536) if 65535 - high >= 4096 else None
    window = below or above
    holders, ports = [], []
    pick = random.SystemRandom()
    try:
        for _ in range(attempts if window else 0):
            if len(ports) == count:
                break
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((ip, pick.randrange(*window)))
            except OSError:
                s.close()
                continue
            holders.append(s)
            ports.append(s.getsockname()[1])
        while len(ports) < count:  # no room outside the ephemeral range: any free port
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((ip, 0))
            holders.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in holders:
            s.close()
    return ports


def could_not_bind(log_file, since):
    """True when what evcxr wrote to `log_file` after byte `since` says a port was taken."""
    try:
        with open(log_file, "rb") as f:
            f.seek(since)
            text = f.read()
    except OSError:
        return False
    return b"Address already in use" in text or b"AddrInUse" in text


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


def remove_dead_kernels_dirs(base, before_removing=None):
    """Removes the directories of kernels whose proxy no longer runs (after
    `before_removing(dir)`)."""
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        pid = name[len(TEMP_PREFIX):]
        if name.startswith(TEMP_PREFIX) and pid.isdigit() and not is_live_proxy(int(pid)):
            if before_removing:
                before_removing(os.path.join(base, name))
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)


def cache_home():
    """The user's cache directory, as evcxr and strata find it."""
    home = os.environ.get("XDG_CACHE_HOME", "")
    return home if os.path.isabs(home) else os.path.join(os.path.expanduser("~"), ".cache")


def complete_entries(cache):
    """The names of the finished entries of an evcxr build cache (evcxr writes `stderr` last)."""
    try:
        names = os.listdir(cache)
    except OSError:
        return []
    return [n for n in names if os.path.isfile(os.path.join(cache, n, "stderr"))]


def private_build_cache(shared, mine):
    """Fills `mine` with the finished entries of `shared`: hard links (no copy of the
    artifacts), except each entry's `hits` counter, which evcxr rewrites on every hit."""
    os.makedirs(mine, exist_ok=True)
    for name in complete_entries(shared):
        src, dst = os.path.join(shared, name), os.path.join(mine, name)
        try:
            os.makedirs(dst)
            for f in os.listdir(src):
                if f == "hits":
                    shutil.copy2(os.path.join(src, f), os.path.join(dst, f))
                else:
                    os.link(os.path.join(src, f), os.path.join(dst, f))
        except OSError:
            # Another file system, or the entry went away: a miss, built again.
            shutil.rmtree(dst, ignore_errors=True)


def merge_build_cache(mine, shared):
    """Moves the entries a kernel built into the shared cache and passes its hits on (the
    shared entry's mtime, which evcxr's trimming reads as the last use)."""
    os.makedirs(shared, exist_ok=True)
    for name in complete_entries(mine):
        src, dst = os.path.join(mine, name), os.path.join(shared, name)
        try:
            if os.path.isdir(dst):
                used = os.path.getmtime(os.path.join(src, "hits"))
                if used > os.path.getmtime(os.path.join(dst, "hits")):
                    os.utime(os.path.join(dst, "hits"), (used, used))
            else:
                os.rename(src, dst)
        except OSError:
            pass


def private_config(config, own, cache, pins_for):
    """A copy of evcxr's configuration directory `config` in `own` whose `init.evcxr` first
    points the builds' cache home at `cache`, and adds the pins crate (`pins_for(dep_spec)`)
    before the `:dep strata` line."""
    os.makedirs(own, exist_ok=True)
    try:
        names = os.listdir(config)
    except OSError:
        names = []
    for name in names:
        if os.path.isfile(os.path.join(config, name)):
            shutil.copy2(os.path.join(config, name), os.path.join(own, name))
    init = os.path.join(own, "init.evcxr")
    try:
        with open(init) as f:
            rest = f.read()
    except OSError:
        rest = ""
    lines = [f":build_env XDG_CACHE_HOME={cache}"]
    for line in rest.splitlines():
        if line.startswith(":dep strata = "):
            pins = pins_for(line[len(":dep strata = "):])
            if pins:
                lines.append(f':dep strata_kernel_pins = {{ path = "{pins}" }}')
        lines.append(line)
    with open(init, "w") as f:
        f.write("\n".join(lines) + "\n")


def repository_lockfile(source):
    """The Cargo.lock of the strata the kernel builds (`git:DIR`: its HEAD's; `path:DIR`: the
    working tree's), or None."""
    kind, _, where = source.partition(":")
    try:
        if kind == "git":
            out = subprocess.run(["git", "-C", where, "show", "HEAD:Cargo.lock"],
                                 capture_output=True, timeout=30)
            return out.stdout if out.returncode == 0 else None
        if kind == "path":
            with open(os.path.join(where, "Cargo.lock"), "rb") as f:
                return f.read()
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def host_triple():
    """rustc's host target (`x86_64-unknown-linux-gnu`), or None."""
    try:
        out = subprocess.run(["rustc", "-vV"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.stdout.splitlines():
        if line.startswith("host: "):
            return line[len("host: "):].strip()
    return None


def locked_packages(dep_spec, lock, log):
    """(name, version) of every registry package the kernel's build of strata (`dep_spec`:
    the right side of its `:dep strata = …`) uses on this machine as normal dependencies, with
    the versions of `lock`: cargo metadata on a scratch crate holding the lockfile."""
    host = host_triple()
    scratch = tempfile.mkdtemp(prefix="strata-kernel-resolve-")
    try:
        with open(os.path.join(scratch, "Cargo.toml"), "w") as f:
            f.write('[package]\nname = "strata_kernel_resolve"\nversion = "0.0.0"\n'
                    f'edition = "2021"\n[lib]\npath = "lib.rs"\n[dependencies]\nstrata = {dep_spec}\n')
        open(os.path.join(scratch, "lib.rs"), "w").close()
        with open(os.path.join(scratch, "Cargo.lock"), "wb") as f:
            f.write(lock)
        cmd = ["cargo", "metadata", "--format-version", "1"]
        if host:
            cmd += ["--filter-platform", host]
        # Offline first (every package of a built strata is on disk, and it takes a fraction of
        # a second); online where a package is missing (a machine that has not built strata).
        out = subprocess.run(cmd + ["--offline"], cwd=scratch, capture_output=True, timeout=300)
        if out.returncode != 0:
            out = subprocess.run(cmd, cwd=scratch, capture_output=True, timeout=300)
        if out.returncode != 0:
            log.write(b"strata kernel: no version pins (cargo metadata failed):\n" + out.stderr[-2000:])
            return None
        meta = json.loads(out.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        log.write(f"strata kernel: no version pins: {e}\n".encode())
        return None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    packages = {p["id"]: p for p in meta["packages"]}
    def proc_macro(i):
        return any("proc-macro" in t["kind"] for t in packages[i]["targets"])

    # A proc-macro's own dependencies are built for the host only: pinning them from a
    # library would build them a second time, for the target.
    seen, todo = set(), [meta["resolve"]["root"]]
    while todo:
        at = todo.pop()
        if at in packages and proc_macro(at):
            continue
        for dep in nodes[at]["deps"]:
            normal = any(k.get("kind") is None for k in dep.get("dep_kinds", []))
            if normal and dep["pkg"] not in seen:
                seen.add(dep["pkg"])
                todo.append(dep["pkg"])
    return sorted((packages[i]["name"], packages[i]["version"]) for i in seen
                  if (packages[i].get("source") or "").startswith("registry+"))


def pins_crate(dep_spec, lock, home, log):
    """The path of a crate that depends on exactly the locked version of each package strata's
    kernel build uses (made once per lockfile and dependency line), or None."""
    key = hashlib.sha256(lock + dep_spec.encode()).hexdigest()[:16]
    pins = os.path.join(home, "strata-kernel-pins", key)
    if os.path.isfile(os.path.join(pins, "Cargo.toml")):
        return pins
    packages = locked_packages(dep_spec, lock, log)
    if not packages:
        return None
    lines = ['[package]\nname = "strata_kernel_pins"\nversion = "0.0.0"\nedition = "2021"\n'
             '[lib]\npath = "lib.rs"\n[dependencies]']
    for k, (name, version) in enumerate(packages):
        lines.append(f'pin{k} = {{ package = "{name}", version = "={version}", default-features = false }}')
    partial = f"{pins}.{os.getpid()}"
    os.makedirs(partial, exist_ok=True)
    with open(os.path.join(partial, "Cargo.toml"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(partial, "lib.rs"), "w") as f:
        f.write("//! Pins the versions of strata's dependencies in the strata Jupyter kernel.\n")
    try:
        os.rename(partial, pins)  # whole or not at all; another kernel may have made it
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
    return pins if os.path.isfile(os.path.join(pins, "Cargo.toml")) else None


TERMINATED = "Subprocess terminated with status: "


def explain_termination(evalue):
    """evcxr's error when the process that runs cells ended (an interrupt kills it) as one line
    that says what happened and what survives, or None for any other error."""
    at = evalue.find(TERMINATED)
    if at < 0:
        return None
    status = evalue[at + len(TERMINATED):].strip()
    before = evalue[:at].rstrip()
    cause = ("Interrupted (or the system ended it, out of memory perhaps)" if "SIGKILL" in status
             else f"The process running this notebook's code ended ({status})")
    line = (f"{cause}: every variable is gone; functions, types, `use` lines and dependencies "
            "are kept. Run the cells that define the values you need again.")
    return f"{before}\n{line}" if before else line


FORGOT_QUESTION_MARK = ("\n(a Result: end the line with ? to display the tensor itself, "
                        "as a table)")


def explain_result(plain):
    """The text evcxr shows for a cell ending in an op's Result without `?` (its Debug:
    `Ok(Tensor { shape: [2], …, values: [..] })`), with a line saying how to see the table."""
    if plain.startswith("Ok(Tensor {") and FORGOT_QUESTION_MARK not in plain:
        return plain + FORGOT_QUESTION_MARK
    return None


class ExecutionCounts:
    """The execution counts the frontends see, numbered by the proxy from 1.

    evcxr 0.22 starts its counter at 1 and adds one before each cell, so a notebook's first
    cell showed `[2]`; it also counts cells run with `store_history` off. The proxy sees every
    request on its way to evcxr: it numbers the ones that count (as Jupyter's protocol says)
    and writes that number into each message evcxr sends about the request (execute_input,
    execute_result, error, execute_reply), found by the request's id."""

    KEPT = 1000  # requests remembered (their late IOPub messages still find their number)

    def __init__(self):
        self.count = 0
        self.by_request = {}

    def request(self, header, content):
        """Numbers an execute_request arriving from a client."""
        if header.get("msg_type") != "execute_request":
            return
        if content.get("store_history", True) and not content.get("silent", False):
            self.count += 1
        self.by_request[header.get("msg_id")] = self.count
        if len(self.by_request) > self.KEPT:
            del self.by_request[next(iter(self.by_request))]

    def number(self, parent, content):
        """Writes the proxy's number into a message evcxr sent about a request; True when it
        changed the content."""
        ours = self.by_request.get(parent.get("msg_id"))
        if ours is None or content.get("execution_count") in (None, ours):
            return False
        content["execution_count"] = ours
        return True


def split_message(frames):
    """(parts, at): a Jupyter message's frames as bytes and the index of its delimiter, or
    (None, None) when the frames are not one."""
    parts = [bytes(f) for f in frames]
    try:
        at = parts.index(b"<IDS|MSG>")
    except ValueError:
        return None, None
    return (parts, at) if len(parts) >= at + 6 else (None, None)


def signed(parts, at, content, key, digest):
    """The message with `content` in place of its own, signed again with the connection's key."""
    parts[at + 5] = json.dumps(content).encode()
    if key:
        mac = hmac.new(key, digestmod=digest)
        for part in parts[at + 2:at + 6]:
            mac.update(part)
        parts[at + 1] = mac.hexdigest().encode()
    return parts


def note_request(frames, counts):
    """Lets `counts` number a request on its way from a client to evcxr (which gets it
    unchanged)."""
    parts, at = split_message(frames)
    if parts is not None and b"execute_request" in parts[at + 2]:
        try:
            counts.request(json.loads(parts[at + 2]), json.loads(parts[at + 5]))
        except ValueError:
            pass


def rewrite_for_readers(frames, key, digest, counts):
    """A message from evcxr as the frontends should read it, signed again with the connection's
    key when it changed: the proxy's execution count (ExecutionCounts), an `error` that reports
    the ended process explained (explain_termination), an `execute_result` that shows a
    tensor's Result with a line more (explain_result); other messages as they are."""
    parts, at = split_message(frames)
    if parts is None or b"execution_count" not in parts[at + 5] and (
            TERMINATED.encode() not in parts[at + 5]):
        return frames
    try:
        header, parent = json.loads(parts[at + 2]), json.loads(parts[at + 3])
        content = json.loads(parts[at + 5])
    except ValueError:
        return frames
    changed = counts.number(parent, content)
    kind = header.get("msg_type")
    if kind == "error":
        text = explain_termination(content.get("evalue", ""))
        if text is not None:
            content["evalue"], content["traceback"] = text, text.splitlines()
            changed = True
    elif kind == "execute_result" and isinstance(content.get("data"), dict):
        text = explain_result(content["data"].get("text/plain", ""))
        if text is not None:
            content["data"]["text/plain"] = text
            changed = True
    return signed(parts, at, content, key, digest) if changed else frames


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
    key = front.get("key", "").encode()
    digest = {"hmac-sha256": hashlib.sha256, "hmac-sha512": hashlib.sha512}.get(
        front.get("signature_scheme", "hmac-sha256"), hashlib.sha256)
    transport = front.get("transport", "tcp")
    if transport != "tcp":
        # Nothing to fix for other transports: run evcxr as it is.
        log = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.execv(evcxr, [evcxr, "--control_file", connection_file])

    # evcxr binds control where the frontend expects it; shell, stdin, IOPub and the
    # heartbeat move to private ports behind this proxy.
    back = dict(front)
    back_file = f"{connection_file}.evcxr-{os.getpid()}.json"

    def choose_back_ports():
        back["iopub_port"], back["hb_port"], back["shell_port"], back["stdin_port"] = (
            free_ports(front["ip"], 4))
        with open(back_file, "w") as f:
            json.dump(back, f)

    choose_back_ports()

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
    # IOPub: evcxr's PUB → this SUB (always read) → a libzmq PUB that drops for laggards.
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(url(front, "iopub"))
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.setsockopt(zmq.LINGER, 0)
    # Shell and stdin: clients' DEALERs → a ROUTER of the proxy's own (zmtp_router: the
    # newest connection of an identity takes it over, as evcxr's does) → one DEALER each →
    # evcxr's ROUTER, which answers with the client's identity after the DEALER's. evcxr sends
    # an input request to the identities of the shell request it serves, so both DEALERs carry
    # one routing id: the request for input reaches the stdin DEALER.
    fronts, backs = {}, {}
    for name in ("shell", "stdin"):
        fronts[name] = Router(front["ip"], front[f"{name}_port"])
        backs[name] = ctx.socket(zmq.DEALER)
        backs[name].setsockopt(zmq.LINGER, 0)
        backs[name].setsockopt(zmq.SNDHWM, 0)
        backs[name].setsockopt(zmq.ROUTING_ID, b"strata-kernel-proxy")
    # The proxy's connections to evcxr's private ports (made again when evcxr is started
    # again on other ports).
    links = [(hb_back, "hb"), (sub, "iopub"), (backs["shell"], "shell"), (backs["stdin"], "stdin")]
    for s, name in links:
        s.connect(url(back, name))
    counts = ExecutionCounts()

    # Interrupts arrive as messages (interrupt_mode "message"); a terminal's Ctrl-C on the
    # whole process group must not stop the proxy.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    log = open(log_file, "ab")
    base = tempfile.gettempdir()
    remove_dead_kernels_dirs(base)
    own_temp = os.path.join(base, f"{TEMP_PREFIX}{os.getpid()}")
    crate = os.path.join(own_temp, "crate")
    os.makedirs(crate, exist_ok=True)
    lock = repository_lockfile(os.environ.get("STRATA_KERNEL_SOURCE", ""))
    shared_home = cache_home()
    shared_cache = os.path.join(shared_home, "evcxr")
    remove_dead_kernels_dirs(
        shared_home, lambda d: merge_build_cache(os.path.join(d, "evcxr"), shared_cache))
    own_cache = os.path.join(shared_home, f"{TEMP_PREFIX}{os.getpid()}")
    private_build_cache(shared_cache, os.path.join(own_cache, "evcxr"))
    env = dict(os.environ, TMPDIR=own_temp, EVCXR_TMPDIR=crate)
    # evcxr's build cache takes a crate built without incremental compilation for a downloaded
    # one and caches it: with CARGO_INCREMENTAL=0 (CI sets it) every cell's crate would be
    # served from the cache, stale, and the kernel dies loading it (exit status 99).
    env.pop("CARGO_INCREMENTAL", None)
    if "EVCXR_CONFIG_DIR" in os.environ:
        env["EVCXR_CONFIG_DIR"] = os.path.join(own_temp, "config")
        private_config(os.environ["EVCXR_CONFIG_DIR"], env["EVCXR_CONFIG_DIR"], own_cache,
                       lambda spec: lock and pins_crate(spec, lock, shared_home, log))

    def launch():
        """Starts evcxr; (the process, the log's length before it wrote anything)."""
        log.flush()
        start = os.path.getsize(log_file) if os.path.exists(log_file) else 0
        return subprocess.Popen(
            [evcxr, "--control_file", back_file],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
            preexec_fn=die_with_parent if sys.platform.startswith("linux") else None,
        ), start

    child, launched_at = launch()
    heard = False  # whether evcxr has sent anything yet
    relaunches = 0

    def end_child_and_clean_up():
        """Stops evcxr if it still runs (SIGTERM, then SIGKILL after 5 s), passes what it
        built to the shared cache, then removes the private connection file and the kernel's
        temporary directory and private cache."""
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        for remove in (lambda: merge_build_cache(os.path.join(own_cache, "evcxr"), shared_cache),
                       lambda: os.remove(back_file), lambda: shutil.rmtree(own_temp),
                       lambda: shutil.rmtree(own_cache)):
            try:
                remove()
            except OSError:
                pass

    def stop(signum, _frame):
        end_child_and_clean_up()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)

    pairs = {hb_front: hb_back, hb_back: hb_front, sub: pub}
    routers = {backs[name]: fronts[name] for name in fronts}
    try:
        while True:
            if child.poll() is not None:
                # A port of evcxr's taken between free_ports and its bind (another program
                # took it): start it again on others, before any client could notice.
                if (heard or child.returncode == 0 or relaunches == 3
                        or not could_not_bind(log_file, launched_at)):
                    break
                relaunches += 1
                log.write(b"strata kernel: a port was taken; starting evcxr on other ports\n")
                for s, name in links:
                    s.disconnect(url(back, name))
                choose_back_ports()
                for s, name in links:
                    s.connect(url(back, name))
                child, launched_at = launch()
                continue
            poller = zmq.Poller()
            for s in (*pairs, *routers):
                poller.register(s, zmq.POLLIN)
            for router in fronts.values():
                writers = router.writers()
                for fd in router.fds():
                    poller.register(fd, zmq.POLLIN | (zmq.POLLOUT if fd in writers else 0))
            for s, events in poller.poll(200):
                if isinstance(s, int):  # a client's connection to the shell or stdin port
                    for name, router in fronts.items():
                        if s in router.by_fd or s == router.listener.fileno():
                            if events & zmq.POLLOUT:
                                router.writable(s)
                            if events & zmq.POLLIN:
                                for identity, frames in router.readable(s):
                                    if name == "shell":
                                        note_request(frames, counts)
                                    backs[name].send_multipart([identity, *frames])
                            break
                    continue
                # Everything waiting on this socket, without blocking.
                while True:
                    try:
                        frames = s.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    heard = True
                    if s is sub or s is backs["shell"]:
                        frames = rewrite_for_readers(frames, key, digest, counts)
                    if s in routers:
                        # evcxr's answer: the client's identity, then the message.
                        routers[s].send(bytes(frames[0]), [bytes(f) for f in frames[1:]])
                    else:
                        pairs[s].send_multipart(frames, copy=False)
    finally:
        end_child_and_clean_up()
    return child.returncode


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    try:
        sys.exit(main(*sys.argv[1:]))
    except Exception:
        # The proxy's own failure (a port Jupyter chose is taken, say) goes to the kernel's
        # log beside evcxr's output, where `strata-jupyter doctor` and the tests look.
        import traceback

        with open(sys.argv[2], "a") as f:
            f.write("strata kernel proxy failed:\n" + traceback.format_exc())
        raise
