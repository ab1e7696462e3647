"""A ZeroMQ ROUTER socket for the kernel's shell and stdin ports, written on ZMTP 3.0 (NULL
security, what every Jupyter client speaks), with evcxr's rule for a reused identity.

Why not libzmq's ROUTER: Jupyter clients of one session share one identity (jupyter_client
gives every client of a KernelManager the session's id), and a client that reconnects keeps
it. evcxr's ROUTER lets the newest connection of an identity take it over and closes the
older one, which reconnects and takes it back when it next needs it: every client keeps
talking. libzmq's ROUTER either refuses the newcomer or, with ROUTER_HANDOVER, detaches the
older one without closing its connection, so that client waits for ever (both broke
`test_every_new_kernel_answers`). This socket does what evcxr's does, so the proxy can stand
on the shell and stdin ports too (it renumbers execution counts there; issue 43).

Wire format (rfc.zeromq.org/spec/23): a 64-byte greeting each way (signature, version 3.0,
mechanism NULL), then a READY command each way (the peer's carries its Socket-Type and its
Identity), then frames: a flags byte (1 more, 2 long, 4 command), the size in one byte or
eight (big-endian), the body. A message is frames up to one without "more".
"""

import socket

MORE, LONG, COMMAND = 1, 2, 4
GREETING = (b"\xff" + b"\x00" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\x00")
            + b"\x00" + b"\x00" * 31)


def frame(body, flags=0):
    """One ZMTP frame."""
    if len(body) > 255:
        return bytes([flags | LONG]) + len(body).to_bytes(8, "big") + body
    return bytes([flags, len(body)]) + body


def ready_command():
    """Our READY: we are a ROUTER."""
    name, value = b"Socket-Type", b"ROUTER"
    return frame(b"\x05READY" + bytes([len(name)]) + name + len(value).to_bytes(4, "big") + value,
                 COMMAND)


def properties(body):
    """A READY command's properties as a dict (after its name)."""
    props, i = {}, 1 + body[0]
    while i < len(body):
        n = body[i]
        name = body[i + 1:i + 1 + n].decode("ascii", "replace").lower()
        size = int.from_bytes(body[i + 1 + n:i + 5 + n], "big")
        props[name] = body[i + 5 + n:i + 5 + n + size]
        i += 5 + n + size
    return props


class Connection:
    """One client's TCP connection: what it sent that is not parsed yet, what waits to be
    written, and where its handshake stands."""

    def __init__(self, sock):
        self.sock = sock
        self.inbox = bytearray()
        self.outbox = bytearray(GREETING + ready_command())
        self.greeted = False
        self.identity = None  # set by the peer's READY
        self.frames = []  # the message being received

    def fileno(self):
        return self.sock.fileno()


class Router:
    """The ROUTER: `recv` gives (identity, frames) for each whole message a client sent;
    `send(identity, frames)` queues a message for the newest connection of that identity
    (dropped, as libzmq's ROUTER drops it, when there is none). The owner polls `fds()` for
    reading and `writers()` for writing, and calls `readable(fd)` / `writable(fd)`."""

    def __init__(self, ip, port):
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((ip, port))
        self.listener.listen(64)
        self.listener.setblocking(False)
        self.by_fd = {}
        self.by_identity = {}
        self.anonymous = 0

    def fds(self):
        return [self.listener.fileno(), *self.by_fd]

    def writers(self):
        return [fd for fd, c in self.by_fd.items() if c.outbox]

    def readable(self, fd):
        """Reads what is waiting on `fd`; returns the whole messages received."""
        if fd == self.listener.fileno():
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return []
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = Connection(sock)
            self.by_fd[sock.fileno()] = conn
            self.writable(sock.fileno())
            return []
        conn = self.by_fd.get(fd)
        if conn is None:
            return []
        try:
            data = conn.sock.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return []
        except OSError:
            data = b""
        if not data:
            self.close(conn)
            return []
        conn.inbox += data
        try:
            return self.parse(conn)
        except ValueError:
            self.close(conn)  # not ZMTP 3 with NULL security
            return []

    def parse(self, conn):
        messages = []
        if not conn.greeted:
            if len(conn.inbox) < 64:
                return messages
            greeting = bytes(conn.inbox[:64])
            del conn.inbox[:64]
            if greeting[0] != 0xFF or greeting[9] != 0x7F or greeting[10] < 3:
                raise ValueError("not a ZMTP 3 greeting")
            if greeting[12:32].rstrip(b"\x00") != b"NULL":
                raise ValueError("only NULL security")
            conn.greeted = True
        while len(conn.inbox) >= 2:
            flags = conn.inbox[0]
            head = 9 if flags & LONG else 2
            if len(conn.inbox) < head:
                break
            size = (int.from_bytes(conn.inbox[1:9], "big") if flags & LONG else conn.inbox[1])
            if len(conn.inbox) < head + size:
                break
            body = bytes(conn.inbox[head:head + size])
            del conn.inbox[:head + size]
            if flags & COMMAND:
                if body[1:1 + body[0]] == b"READY":
                    self.take_identity(conn, properties(body).get("identity", b""))
                continue  # PING and others: nothing to answer at ZMTP 3.0
            if conn.identity is None:
                raise ValueError("a message before READY")
            conn.frames.append(body)
            if not flags & MORE:
                messages.append((conn.identity, conn.frames))
                conn.frames = []
        return messages

    def take_identity(self, conn, identity):
        """The newest connection of an identity takes it over; the older one is closed (its
        client reconnects, as with evcxr's ROUTER). No identity: a fresh one, as libzmq's."""
        if not identity:
            self.anonymous += 1
            identity = b"\x00" + self.anonymous.to_bytes(4, "big")
        older = self.by_identity.get(identity)
        if older is not None and older is not conn:
            self.close(older)
        conn.identity = identity
        self.by_identity[identity] = conn

    def send(self, identity, frames):
        conn = self.by_identity.get(bytes(identity))
        if conn is None:
            return
        for i, body in enumerate(frames):
            conn.outbox += frame(bytes(body), MORE if i < len(frames) - 1 else 0)
        self.writable(conn.fileno())

    def writable(self, fd):
        """Writes what waits for `fd` as far as the connection takes it."""
        conn = self.by_fd.get(fd)
        if conn is None or not conn.outbox:
            return
        try:
            sent = conn.sock.send(conn.outbox)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close(conn)
            return
        del conn.outbox[:sent]

    def close(self, conn):
        self.by_fd.pop(conn.fileno(), None)
        if conn.identity is not None and self.by_identity.get(conn.identity) is conn:
            del self.by_identity[conn.identity]
        try:
            conn.sock.close()
        except OSError:
            pass
