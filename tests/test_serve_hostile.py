"""serve.py against hostile clients and settings: every number a request carries is
answered or refused naming the field (never a 500), a web page on another site cannot
drive it (Content-Type, Host), slow or silent connections are closed after
--request_timeout, a connection flood past the file limit leaves it answering, and an
API key no client could send is refused at start."""

import collections
import json
import signal
import socket
import subprocess
import sys
import time

import pytest
from repo import REPO
from serve_helpers import Server, get, post, write_checkpoint

TIMEOUT_S = 1.5  # --request_timeout of the servers below


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("hostile") / "chat.pt")


@pytest.fixture(scope="module")
def server(checkpoint):
    s = Server(f"--ckpt={checkpoint}", "--model_name=tiny", f"--request_timeout={TIMEOUT_S}",
               "--allowed_hosts=gpt.example.org", env={"GPT_FAULTS": "token_delay=0.04"})
    yield s
    code, err = s.stop()
    assert code == 0 and "Traceback" not in err, err  # nothing a client sent made one


def chat(server, extra=None, raw=None, headers=None):
    body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 3, **(extra or {})}
    return post(server.url + "/v1/chat/completions", body, raw=raw, headers=headers)


def raw_chat(server, field, literal):
    """A request whose `field` is written as JSON text `literal` (NaN, 1e999, 5,000 digits...)."""
    text = '{"messages": [{"role": "user", "content": "hello"}], "max_tokens": 1, "%s": %s}' % (field, literal)
    return chat(server, raw=text.encode())


NUMBER_FIELDS = ["temperature", "top_p", "min_p", "repetition_penalty", "top_k", "max_tokens",
                 "max_completion_tokens", "seed"]
HOSTILE = ["1e-300", "-1e-300", "5e-324", "-1", "0", "1e300", "-1e300", "1e999", "-1e999", "NaN", "Infinity",
           "9" * 5000, "-" + "9" * 5000, "12345678901234567890123456789", "1.5", "true", "\"0.5\"", "[]", "{}"]


def test_every_number_field_is_answered_or_refused_naming_the_field(server):
    for field in NUMBER_FIELDS:
        for literal in HOSTILE:
            status, reply = raw_chat(server, field, literal)
            assert status in (200, 400), (field, literal[:20], status, reply)
            if status == 400:
                error = reply["error"]
                assert set(error) == {"message", "type", "param", "code"} and error["param"] == field, reply
                assert error["message"].startswith(field) and len(error["message"]) < 300, reply
    assert get(server.url + "/health")[0] == 200


def test_tiny_temperature_and_top_p_are_greedy_and_a_tiny_penalty_is_refused(server):
    greedy = chat(server, {"temperature": 0})
    assert greedy[0] == 200
    text = greedy[1]["choices"][0]["message"]["content"]
    for extra in ({"temperature": 1e-300}, {"temperature": 1e-7}, {"top_p": 1e-300, "seed": 3}):
        status, reply = chat(server, extra)
        assert status == 200 and reply["choices"][0]["message"]["content"] == text, (extra, reply)
    for value in (1e-300, 1e300):
        status, reply = chat(server, {"repetition_penalty": value})
        assert status == 400 and "between 0.01 and 100" in reply["error"]["message"], reply


def test_a_5000_digit_integer_is_a_400_naming_the_field(server):
    status, reply = raw_chat(server, "max_tokens", "9" * 5000)
    assert status == 400 and reply["error"]["param"] == "max_tokens", reply
    assert "5,000-digit" in reply["error"]["message"]
    status, reply = chat(server, raw=b'{"messages": [{"role": "user", "content": "hello"}], "n": ' + b"1" * 5000 + b"}")
    assert status == 400 and reply["error"]["param"] == "n", reply  # a field checked elsewhere: the same


def idle_soon(server, within_s=5.0):
    deadline = time.monotonic() + within_s
    while get(server.url + "/health")[1]["busy"] != 0:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                          None, "application/jsonp", "text/json"])
def test_a_body_not_declared_json_is_a_415(server, content_type):
    headers = {"Content-Type": content_type} if content_type else {}
    body = json.dumps({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}).encode()
    conn = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    conn.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n{head}Content-Length: {len(body)}\r\n"
                 f"Connection: close\r\n\r\n".encode() + body)
    reply = b""
    while chunk := conn.recv(4096):
        reply += chunk
    status = int(reply.split(b" ")[1])
    error = json.loads(reply.partition(b"\r\n\r\n")[2])["error"]
    assert status == 415 and error["code"] == "unsupported_media_type" and "application/json" in error["message"]
    assert idle_soon(server)  # nothing was generated (the previous case's place may take a moment to free)
    ok = chat(server, headers={"Content-Type": "Application/JSON; charset=utf-8"})  # what clients send passes
    assert ok[0] == 200


def host_status(server, host, path="/health"):
    conn = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    conn.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    reply = b""
    while chunk := conn.recv(4096):
        reply += chunk
    return int(reply.split(b" ")[1]), reply.partition(b"\r\n\r\n")[2]


def test_a_foreign_host_is_refused_and_the_servers_own_names_served(server):
    port = server.port
    for host in ("evil.example.com", f"evil.example.com:{port}", "127.0.0.1.evil.example.com", "localhost.evil.com",
                 "gpt.example.org.evil.com"):
        for path in ("/", "/health", "/v1/models"):
            status, body = host_status(server, host, path)
            assert status == 400 and json.loads(body)["error"]["code"] == "invalid_host", (host, path, body)
    import platform

    for host in ("localhost", f"localhost:{port}", "127.0.0.1", f"127.0.0.1:{port}", f"[::1]:{port}", "LOCALHOST.",
                 "gpt.example.org", f"GPT.example.org:{port}", platform.node()):
        assert host_status(server, host)[0] == 200, host


def test_a_server_on_every_address_serves_the_address_it_was_reached_at():
    """--host 0.0.0.0: a client on the network names the address it connected to (uvicorn's
    scope["server"]); another address, or the wildcard itself, is not this server's name."""
    import asyncio

    from gptkit.serve.guard import HostGuard, allowed_host_names

    def served(host, arrived_at, names=allowed_host_names("0.0.0.0", [])):
        calls = []

        async def app(scope, receive, send):
            calls.append("app")

        async def refused(scope, receive, send):
            calls.append("refused")

        guard = HostGuard(app, names, refuse=lambda message: refused)
        scope = {"type": "http", "headers": [(b"host", host.encode())], "server": (arrived_at, 8000)}
        asyncio.run(guard(scope, None, None))
        return calls == ["app"]

    assert served("192.0.2.7:8000", "192.0.2.7") and served("[2001:db8::7]:8000", "2001:db8::7")
    assert not served("192.0.2.8:8000", "192.0.2.7") and not served("0.0.0.0:8000", "192.0.2.7")
    assert served("localhost", "192.0.2.7") and not served("evil.example.com", "192.0.2.7")
    assert allowed_host_names("0.0.0.0", ["*"]) is None and served("evil.example.com", "192.0.2.7", names=None)


def seconds_until_closed(server, sends):
    """For each (bytes, bytes per 0.1 s) of `sends`, one connection sending them at that pace:
    the seconds until the server closed each (None: still open 10 s after the timeout)."""
    socks = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in sends]
    closed, t0, tick = [None] * len(sends), time.monotonic(), 0
    for sock in socks:
        sock.setblocking(False)
    while None in closed and time.monotonic() - t0 < TIMEOUT_S + 10:
        for i, (sock, (data, pace)) in enumerate(zip(socks, sends)):
            if closed[i] is not None:
                continue
            try:
                if tick * pace < len(data):
                    sock.send(data[tick * pace: (tick + 1) * pace])
                if sock.recv(4096) == b"":
                    closed[i] = time.monotonic() - t0
            except BlockingIOError:
                pass
            except OSError:
                closed[i] = time.monotonic() - t0
        tick += 1
        time.sleep(0.1)
    for sock in socks:
        sock.close()
    return closed


def test_slow_and_silent_connections_are_closed_after_the_timeout(server):
    slow_headers = b"GET /health HTTP/1.1\r\n" + b"X-Slow: " + b"a" * 400 + b"\r\n\r\n"
    slow_body = (b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 400\r\n\r\n" + b" " * 400)
    kept_alive = b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n"  # answered at once, then nothing more
    # 10 of each at once: silent, headers a byte at a time, a body a byte at a time, idle after a reply
    kinds = [(b"", 1), (slow_headers, 1), (slow_body, 1), (kept_alive, len(kept_alive))]
    times = seconds_until_closed(server, [kind for kind in kinds for _ in range(10)])
    for k, kind in enumerate(kinds):
        mine = times[10 * k: 10 * (k + 1)]
        assert None not in mine and TIMEOUT_S - 0.2 < min(mine) and max(mine) < TIMEOUT_S + 2, (kind[0][:20], mine)
    assert get(server.url + "/health") == (200, {"status": "ok", "model": "tiny", "busy": 0, "capacity": 32})


def test_a_reply_longer_than_the_timeout_is_not_cut(server):
    t0 = time.monotonic()  # 40 ms a token: 64 tokens (the block) take longer than the timeout
    status, reply = post(server.url + "/v1/completions", {"prompt": "ab", "max_tokens": 64, "temperature": 0})
    assert status == 200 and reply["usage"]["completion_tokens"] == 64, reply
    assert time.monotonic() - t0 > TIMEOUT_S


def test_a_connection_flood_past_the_file_limit_leaves_the_server_answering(checkpoint):
    """ulimit -n 64 and 200 silent connections: the stalest silent ones are closed to take
    new ones (not left to their timeout), so a real request is answered during the flood
    and at once after it; running out of descriptors is a warning line, not tracebacks."""
    s = Server(f"--ckpt={checkpoint}", "--allowed_hosts=*", "--require_json=false", open_files=64)
    flood = []
    try:
        for _ in range(200):  # far past 64 file descriptors: the kernel holds what the server cannot take
            flood.append(socket.create_connection(("127.0.0.1", s.port), timeout=10))
        t0 = time.monotonic()
        assert get(s.url + "/health", timeout=8)[0] == 200 and time.monotonic() - t0 < 4  # not the 10 s timeout
        for sock in flood:
            sock.close()
        t0 = time.monotonic()
        assert get(s.url + "/health", timeout=8)[0] == 200 and time.monotonic() - t0 < 4
        # the server configured otherwise takes any Host and any Content-Type
        assert host_status(s, "anything.example.com")[0] == 200
        body = json.dumps({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}).encode()
        assert post(s.url + "/v1/chat/completions", None, raw=body, headers={"Content-Type": "text/plain"})[0] == 200
    finally:
        for sock in flood:
            sock.close()
        code, err = s.stop(signal.SIGINT)
    assert code == 0 and "Traceback" not in err, err
    warnings = [line for line in err.splitlines() if "out of file descriptors" in line]
    assert len(warnings) <= 2, err  # said once in a while, not a traceback each time


def test_past_the_file_limit_with_every_connection_busy_a_new_one_is_answered_503(checkpoint):
    """ulimit -n 64 leaves room for 8 connections (guard.connection_limit's floor). With 8
    busy (their bodies still coming: none silent, none to close), a ninth is answered 503
    with Retry-After, in OpenAI's error shape, not closed unanswered: a GET, a POST whose
    body goes out after the answer, and a client that reads before it sends. Once the 8
    go, requests are answered again; 60 at once (their connections all made before any
    is read, so none looks silent) are each answered, 200 or 503, none reset."""
    s = Server(f"--ckpt={checkpoint}", "--allowed_hosts=*", "--require_json=false", "--queue_size=64",
               open_files=64, env={"GPT_FAULTS": "token_delay=0.02"})
    busy, burst = [], []
    try:
        for _ in range(8):
            busy.append(socket.create_connection(("127.0.0.1", s.port), timeout=10))
            busy[-1].sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        time.sleep(0.5)  # the server has read their headers: each is busy with its request
        status, body = get(s.url + "/health", timeout=8)
        assert status == 503 and body["error"]["code"] == "too_many_connections", body
        assert "ulimit -n" in body["error"]["message"] and body["error"]["type"] == "server_error"
        status, body = post(s.url + "/v1/completions", {"prompt": "ab" * 20_000, "max_tokens": 1}, timeout=8)
        assert status == 503 and body["error"]["code"] == "too_many_connections", body
        with socket.create_connection(("127.0.0.1", s.port), timeout=8) as quiet:
            answer = quiet.makefile("rb").read()  # sends nothing: the answer comes, then the end
        assert answer.startswith(b"HTTP/1.1 503 ") and b"\r\nretry-after: 1\r\n" in answer.lower(), answer
        for sock in busy:
            sock.close()
        time.sleep(0.3)
        assert get(s.url + "/health", timeout=8)[0] == 200

        body = json.dumps({"prompt": "ab", "max_tokens": 20})
        request = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
                   f"Connection: close\r\n\r\n{body}").encode()
        burst = []  # each request sent whole at once, the next connection made at once after
        for _ in range(60):
            burst.append(socket.create_connection(("127.0.0.1", s.port), timeout=20))
            burst[-1].sendall(request)
        answers = collections.Counter()
        for sock in burst:
            try:
                answers[sock.makefile("rb").readline().split(b" ")[1].decode()] += 1
            except (OSError, IndexError) as e:  # reset, or closed with no answer
                answers[repr(e)] += 1
            sock.close()
        answers = {int(k) if k.isdigit() else k: v for k, v in answers.items()}
        assert set(answers) <= {200, 503} and answers[200] >= 8, answers
    finally:
        for sock in busy + burst:
            sock.close()
        code, err = s.stop(signal.SIGINT)
    assert code == 0 and "Traceback" not in err, err


@pytest.mark.parametrize("args, key, says", [
    (["--api_key= secret"], None, "(--api_key) starts or ends with white space"),
    (["--api_key=secret\t"], None, "starts or ends with white space"),
    (["--api_key=sécret"], None, "outside printable ASCII"),
    (["--api_key=se\x7fcret"], None, "outside printable ASCII"),
    (["--api_key="], None, "is empty"),
    ([], "secret ", "(GPTKIT_API_KEY) starts or ends with white space"),
    ([], "clé", "outside printable ASCII"),
    (["--request_timeout=0"], None, "request_timeout=0.0 must be above 0"),
    (["--request_timeout=nan"], None, "request_timeout=nan must be above 0"),
    (["--allowed_hosts=evil.com/x"], None, "'evil.com/x' is not a host name"),
    (["--stream_interval=-0.1"], None, "stream_interval=-0.1 must be between 0 and 1 second"),
    (["--stream_interval=nan"], None, "stream_interval=nan must be between 0 and 1 second"),
])
def test_settings_no_client_could_use_are_refused_before_anything_loads(tmp_path, monkeypatch, args, key, says):
    import serve
    from gptkit.ops.errors import UserError

    monkeypatch.delenv("GPTKIT_API_KEY", raising=False)
    if key is not None:
        monkeypatch.setenv("GPTKIT_API_KEY", key)
    with pytest.raises(UserError) as e:  # the checkpoint is missing: refused before it is looked for
        serve.main([f"--ckpt={tmp_path / 'missing.pt'}", "--port=0", *args])
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_key_with_a_space_is_one_line_and_exit_2():
    import os

    environment = {**os.environ, "GPTKIT_API_KEY": " secret"}
    r = subprocess.run([sys.executable, str(REPO / "serve.py"), "--port=0", "--ckpt=missing.pt"], cwd=REPO,
                       capture_output=True, text=True, timeout=60, env=environment)
    assert r.returncode == 2 and r.stderr.startswith("error: the API key (GPTKIT_API_KEY) starts or ends with white space"), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


SIGNAL_WHILE_LOCKED = """
import os, signal, sys, threading, types, urllib.request
from gptkit.serve.app import run_server
from gptkit.serve.server import bind

class Worker:  # the worker's lock, as submit() and busy() hold it on the event loop's thread
    def __init__(self):
        self.lock, self.stopped = threading.Lock(), False

    def stop(self):
        with self.lock:
            self.stopped = True

worker = Worker()

async def app(scope, receive, send):
    if scope["type"] == "http":
        with worker.lock:
            os.kill(os.getpid(), signal.SIGTERM)  # its handler runs at the next bytecodes: here
            sum(range(1000))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

sock = bind("127.0.0.1", 0)
url = "http://127.0.0.1:%d/" % sock.getsockname()[1]
threading.Thread(target=lambda: urllib.request.urlopen(url, timeout=20).read(), daemon=True).start()
run_server(app, types.SimpleNamespace(cfg=types.SimpleNamespace(request_timeout=5), worker=worker), sock)
print("stopped", worker.stopped)
"""


def test_a_signal_while_the_event_loop_holds_the_workers_lock_still_stops_the_server():
    """A signal handler runs between any two bytecodes of the main thread, which also runs
    the event loop: stopping the worker inside it, while the loop held the worker's lock
    (a request being admitted, /health counting), hung serve.py for good."""
    import os

    try:
        r = subprocess.run([sys.executable, "-c", SIGNAL_WHILE_LOCKED], cwd=REPO, capture_output=True, text=True,
                           timeout=30, env={**os.environ, "PYTHONPATH": str(REPO)})
    except subprocess.TimeoutExpired:
        pytest.fail("serve.py's signal handler deadlocked on the worker's lock")
    assert r.returncode == 0 and r.stdout.strip() == "stopped True", r.stdout + r.stderr
