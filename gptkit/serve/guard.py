"""serve.py's defences against clients that are not what they seem, each installed in
one line by gptkit/serve/app.py:

- HostGuard: a request whose Host header names another site is refused. A web page can
  point a name it owns at 127.0.0.1 (DNS rebinding) and then read this server's replies
  as its own; the browser still sends the page's name as the Host, which this refuses.
  (A Content-Type other than JSON, the other thing a page can send unasked, is refused
  where the body is read: app.py's read_json.)
- timed_protocol: uvicorn's HTTP/1.1 protocol with a deadline: a client has
  `request_timeout` seconds from connecting (or from its last reply) to send a whole
  request, headers and body, or its connection is closed. Slow or silent clients then
  cannot hold the server's connections (and file descriptors) for longer than that;
  and near the file limit (connection_limit), a new connection closes the one that
  has waited longest without a request, so a flood of them does not keep others out;
  where none is silent, the new one is answered 503 (refusal) and closed. A connection
  turned away for want of room is answered, never just closed (a reset tells a client nothing).
- QuietAcceptErrors: running out of file descriptors anyway is a warning line now and
  then, not asyncio's traceback for every accept() that failed.

    python serve.py --allowed_hosts=gpt.example.org    # a name of this machine, besides localhost
    python serve.py --allowed_hosts='*'                # any Host (behind a proxy that checks it)
"""

import errno
import json
import os
import socket
import struct
import sys

LISTEN_BACKLOG = 128  # connections the kernel holds for us to accept (asyncio takes this many at a time)
REFUSED_LINGER_S = 2.0  # a connection answered 503 at once is kept this long at most, for its client to read it
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARDS = ("", "0.0.0.0", "::")


def allowed_host_names(bound_host, extra):
    """The Host names served: loopback, the address bound (unless a wildcard), this
    machine's name, and `extra` (--allowed_hosts' names); None when extra holds '*'."""
    if "*" in extra:
        return None
    names = {*LOOPBACK_NAMES, socket.gethostname().lower(), *(name.lower() for name in extra)}
    if bound_host.lower() not in WILDCARDS:
        names.add(normal(bound_host))
    return names


def parse_allowed_hosts(text):
    """--allowed_hosts' comma-separated names (or '*'); ValueError naming a bad one."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    for name in names:
        if name != "*" and (not name.isascii() or not all(c.isalnum() or c in ".-_:[]" for c in name)):
            raise ValueError(f"allowed_hosts: {name!r} is not a host name or address (names are separated by commas)")
    return names


def normal(host):
    """A Host header's name, without port, brackets or a trailing dot, in lower case."""
    host = host.strip().lower()
    if host.startswith("["):  # [::1]:8000
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:  # name:8000 (more colons: a bare IPv6 address)
        host = host.partition(":")[0]
    return host.rstrip(".")


class HostGuard:
    """ASGI middleware: a 400 in OpenAI's error shape for a Host that is none of `names`
    nor the address the connection arrived at (names None: every Host is served)."""

    def __init__(self, app, names, refuse):
        self.app, self.names, self.refuse = app, names, refuse

    async def __call__(self, scope, receive, send):
        if self.names is not None and scope["type"] == "http":
            host = dict(scope["headers"]).get(b"host")
            if host is not None:  # absent: an HTTP/1.0 client, never a browser
                name = normal(host.decode("latin-1"))
                local = (scope.get("server") or ("",))[0]
                if name not in self.names and name != local:
                    response = self.refuse(f"the Host {name!r}"[:80] + " is not this server's name: a web page on "
                                           "another site may be trying to reach it (DNS rebinding); serve.py "
                                           "--allowed_hosts=NAME serves another name")
                    return await response(scope, receive, send)
        await self.app(scope, receive, send)


def connection_limit(spare=2 * LISTEN_BACKLOG + 16):
    """How many connections may be open at once: the file-descriptor limit (ulimit -n) less
    those open now and `spare` (asyncio's accept() bursts, closes still under way, the rest
    of the process), at least 8; None when there is no limit."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        open_now = len(os.listdir("/dev/fd"))
    except (ImportError, OSError):  # Windows, or no /dev/fd: leave it to the system
        return None
    if soft == resource.RLIM_INFINITY:
        return None
    return max(8, soft - open_now - spare)


class QuietAcceptErrors:
    """asyncio's exception handler for the server's loop: accept() failing for want of file
    descriptors is one warning line every `every_s` seconds instead of a traceback each
    time; anything else goes to asyncio's own. (asyncio schedules a retry a second later
    for each failed accept(); retries still pending when the server stops find the
    listening socket closed, a ValueError that is said nowhere either.)"""

    def __init__(self, every_s=10.0):
        self.every_s, self.last = every_s, None

    def __call__(self, loop, context):
        error = context.get("exception")
        retry = getattr(context.get("handle"), "_callback", None)
        if isinstance(error, ValueError) and getattr(retry, "__name__", "") == "_start_serving":
            return  # a retry after the stop: nothing to serve any more
        if not (isinstance(error, OSError) and error.errno in (errno.EMFILE, errno.ENFILE)):
            return loop.default_exception_handler(context)
        if self.last is None or loop.time() - self.last >= self.every_s:
            self.last = loop.time()
            print("warning: out of file descriptors (ulimit -n): new connections wait until others close; "
                  "silent ones are closed first", file=sys.stderr, flush=True)


def refusal(body):
    """The bytes of an HTTP 503 whose JSON body is `body`, for a connection the server
    has no room for: written before its request is read, then the connection closes."""
    data = json.dumps(body).encode()
    head = ("HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
            f"content-length: {len(data)}\r\nretry-after: 1\r\nconnection: close\r\n\r\n")
    return head.encode() + data


def unread_bytes(transport):
    """How many bytes the kernel holds for this connection that are not read yet (FIONREAD;
    0 where the system cannot say)."""
    try:
        import fcntl
        import termios

        fd = transport.get_extra_info("socket").fileno()
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    except (ImportError, AttributeError, OSError, ValueError):
        return 0


def timed_protocol(request_timeout, max_connections, refused=b""):
    """uvicorn's h11 protocol class, closing a connection whose request is not whole
    `request_timeout` seconds after the connection opened or its last reply ended, and,
    past `max_connections` open at once, the one that has waited longest without a request;
    where none has, the new connection is answered `refused` (refusal's bytes) and closed."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class TimedH11Protocol(H11Protocol):
        deadline = None
        refusing = False  # answered 503 before its request: what it sends is dropped unread

        def connection_made(self, transport):
            super().connection_made(transport)
            self.arm()
            if max_connections is not None and len(self.connections) > max_connections:
                # Full: a new client must not wait for silent ones to time out (nor the next
                # accept() fail for want of a file descriptor), so the stalest silent one goes,
                # answered 503 too. Silent: no request begun, none waiting unread (in a burst,
                # connections are all made before any is read: those are requests, not silence).
                silent = [c for c in self.connections if c is not self and not c.refusing
                          and c.conn.their_state is h11.IDLE and not c.transport.is_closing()
                          and not unread_bytes(c.transport)]
                if silent:
                    stalest = min(silent, key=lambda c: c.since)
                    stalest.transport.write(refused)
                    stalest.transport.close()
                else:
                    self.refuse()

        def refuse(self):
            """The 503, then our half of the connection closed: the client reads it whether
            it sends its request first or not (the request is read and dropped, so closing
            never meets unread bytes, which would reset the connection before the answer)."""
            self.refusing = True
            self.transport.write(refused)
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.deadline.cancel()
            self.deadline = self.loop.call_later(REFUSED_LINGER_S, self.transport.close)

        def data_received(self, data):
            if not self.refusing:
                super().data_received(data)

        def on_response_complete(self):
            super().on_response_complete()
            self.arm()

        def connection_lost(self, exc):
            if self.deadline is not None:
                self.deadline.cancel()
            super().connection_lost(exc)

        def arm(self):
            if self.deadline is not None:
                self.deadline.cancel()
            self.since = self.loop.time()
            self.deadline = self.loop.call_later(request_timeout, self.expire)

        def expire(self):
            # IDLE: not even the headers yet; SEND_BODY: the body is still coming. A request
            # whose body arrived (DONE) is being answered: a long reply is not cut.
            if self.conn.their_state in (h11.IDLE, h11.SEND_BODY) and not self.transport.is_closing():
                self.transport.close()

    return TimedH11Protocol
