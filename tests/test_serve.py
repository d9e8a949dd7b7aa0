"""serve.py through real clients: the official `openai` package, plain HTTP for the edge
cases, sample.py --chat for the replies it must equal, and signals for its end."""

import concurrent.futures
import http.client
import json
import signal
import socket
import time

import pytest
from serve_helpers import Server, get, post, sample_chat, write_checkpoint

from gptkit.serve.server import exposure_warning

openai = pytest.importorskip("openai")

KEY = "test-key-7"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    return write_checkpoint(tmp / "chat.pt"), write_checkpoint(tmp / "plain.pt", chat=False)


@pytest.fixture(scope="module")
def server(checkpoints):
    s = Server(f"--ckpt={checkpoints[0]}", "--model_name=tiny-chat", "--queue_size=20")
    yield s
    code, err = s.stop(signal.SIGINT)  # Ctrl-C: a clean stop too
    assert code == 0 and "Traceback" not in err and err.rstrip().endswith("stopped"), err


@pytest.fixture(scope="module")
def slow(checkpoints):
    """The plain model, slowed to 40 ms a token, one request at a time, with a key."""
    s = Server(f"--ckpt={checkpoints[1]}", "--queue_size=1", env={"GPT_FAULTS": "token_delay=0.04",
                                                                   "GPTKIT_API_KEY": KEY})
    yield s
    s.stop()


def client(server, key="none"):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=30)


def chat(server, messages, **options):
    return client(server).chat.completions.create(model="tiny-chat", messages=messages, temperature=0, **options)


def test_openai_client_chat_plain_and_streamed_agree(server):
    messages = [{"role": "system", "content": "be brief."}, {"role": "user", "content": "hello there"}]
    plain = chat(server, messages, max_tokens=20)
    text = plain.choices[0].message.content
    assert plain.model == "tiny-chat" and plain.choices[0].finish_reason in ("stop", "length")
    assert plain.usage.prompt_tokens == 1 + 9 + 1 + 1 + 11 + 1 + 1  # turn tokens around each content, <|assistant|>
    assert plain.usage.completion_tokens == len(text) + (plain.choices[0].finish_reason == "stop")
    pieces, finish, usage = [], None, None
    for chunk in chat(server, messages, max_tokens=20, stream=True, stream_options={"include_usage": True}):
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(pieces) == text and len([p for p in pieces if p]) > 1  # streamed piece by piece
    assert finish == plain.choices[0].finish_reason and usage.total_tokens == plain.usage.total_tokens


def test_completions_continue_text_and_stop_at_a_stop_string(server):
    c = client(server)
    full = c.completions.create(model="tiny-chat", prompt="the cat", max_tokens=30, temperature=0)
    text = full.choices[0].text
    assert full.object == "text_completion" and full.usage.prompt_tokens == 7
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model="tiny-chat", prompt="the cat", max_tokens=30, temperature=0, stream=True) if ch.choices)
    assert streamed == text
    stop = text[5:7]
    cut = c.completions.create(model="tiny-chat", prompt="the cat", max_tokens=30, temperature=0, stop=[stop])
    assert cut.choices[0].text == text[: text.index(stop)] and cut.choices[0].finish_reason == "stop"


def test_models_health_and_the_page(server):
    status, models = get(server.url + "/v1/models")
    assert status == 200 and [m["id"] for m in models["data"]] == ["tiny-chat"] and models["data"][0]["chat"]
    assert get(server.url + "/health") == (200, {"status": "ok", "model": "tiny-chat", "busy": 0, "capacity": 20})
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("GET", "/")
    r = conn.getresponse()
    page = r.read().decode()
    assert r.status == 200 and "/v1/chat/completions" in page
    assert "http:" not in page and "https:" not in page and "src=" not in page  # nothing loaded from elsewhere


def test_temperature_0_replies_equal_sample_py_chat_as_the_history_outgrows_the_context(server, checkpoints):
    users = ["hello there", "what is new", "tell me more"]
    expected = sample_chat(checkpoints[0], users, "--temperature=0", "--max_new_tokens=20")
    messages, dropped = [], []
    for user, want in zip(users, expected):
        messages.append({"role": "user", "content": user})
        status, reply = post(server.url + "/v1/chat/completions",
                             {"model": "tiny-chat", "messages": messages, "temperature": 0, "max_tokens": 20})
        assert status == 200, reply
        assert reply["choices"][0]["message"]["content"] == want
        dropped.append(reply["gptkit"]["dropped_messages"])
        messages.append({"role": "assistant", "content": want})
    # block_size 64, room for 20 new tokens: the third prompt no longer fits whole, sample.py drops a turn too
    assert dropped[0] == 0 and dropped[-1] >= 2


MALFORMED = [  # (body or raw bytes, path, status, what the message says, param)
    (b"{not json", "chat", 400, "not JSON", None),
    (b"[1, 2]", "chat", 400, "JSON object", None),
    ({"messages": "hi"}, "chat", 400, "messages must be", "messages"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "chat", 400, "role must be one of", "messages[0].role"),
    ({"messages": [{"role": "user", "content": 7}]}, "chat", 400, "content must be", "messages[0].content"),
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, "chat", 400, "temperature", "temperature"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -3}, "chat", 400, "max_tokens", "max_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, "chat", 400, "stream", "stream"),
    ({"messages": [{"role": "user", "content": "hi"}], "model": "gpt-4"}, "chat", 404, "does not exist", "model"),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 0}, "chat", 400, "n must be between 1 and 16", "n"),
    ({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}, "chat", 400,
     "the field 'tools' is not supported", "tools"),
    ({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}}, "chat", 400,
     "the field 'response_format' is not supported", "response_format"),
    ({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 3}, "chat", 400, "needs logprobs",
     "top_logprobs"),
    ({"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 21}, "chat", 400,
     "top_logprobs must be between 0 and 20", "top_logprobs"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "system", "content": "x"}]}, "chat", 400,
     "only the first", "messages[1].role"),
    ({"messages": [{"role": "user", "content": "HI"}]}, "chat", 400, "outside this model's character vocabulary", None),
    ({"messages": [{"role": "user", "content": "a" * 70}]}, "chat", 400, "more than the model's context", None),
    ({"prompt": 12}, "completions", 400, "prompt must be", "prompt"),
    ({"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, "completions", 400, "list of up to 4", "stop"),
    ({"prompt": "hi", "stop": ["a", ""]}, "completions", 400, "non-empty string", "stop"),
    ({"prompt": "hi", "logprobs": 6}, "completions", 400, "logprobs must be between 0 and 5", "logprobs"),
    (b"{" + b"\"x\": 1, " * 200_000 + b"}", "completions", 413, "over the limit of 1,000,000 bytes", None),
]


def test_malformed_requests_get_openai_errors_and_the_server_keeps_answering(server):
    for body, path, status, says, param in MALFORMED:
        raw = body if isinstance(body, bytes) else None
        got, reply = post(f"{server.url}/v1/{'chat/completions' if path == 'chat' else path}", body, raw=raw)
        assert got == status, (body if raw is None else raw[:40], reply)
        error = reply["error"]
        assert set(error) == {"message", "type", "param", "code"} and says in error["message"], reply
        assert error["param"] == param and "Traceback" not in error["message"]
        assert get(server.url + "/health")[0] == 200
    assert get(server.url + "/v1/nowhere") == (404, {"error": {"message": "no such endpoint: GET /v1/nowhere",
                                                               "type": "invalid_request_error", "param": None,
                                                               "code": None}})
    with pytest.raises(openai.BadRequestError, match="max_tokens"):  # the openai client sees the same errors
        chat(server, [{"role": "user", "content": "hi"}], max_tokens=-1)
    capped = chat(server, [{"role": "user", "content": "hi"}], max_tokens=10_000)  # capped at block_size, said so
    assert capped.model_extra["gptkit"] == {"max_tokens": 64, "max_tokens_capped": True, "dropped_messages": 0}


def stream_text(url, body):
    """The streamed text of one request through plain HTTP, read event by event."""
    r = post_stream(url, body)
    text = ""
    for line in r:
        line = line.decode().strip()
        if line.startswith("data: ") and line != "data: [DONE]":
            choice = json.loads(line[6:])["choices"]
            text += choice[0]["delta"].get("content") or "" if choice else ""
    return text


def post_stream(url, body, headers=None):
    import urllib.request

    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **(headers or {})})
    return urllib.request.urlopen(request, timeout=60)


def test_sixteen_concurrent_streams_each_get_their_own_reply(server):
    url = server.url + "/v1/chat/completions"
    # half greedy, half sampled with a seed of their own: each reply is fixed, and most differ
    bodies = [{"messages": [{"role": "user", "content": f"say {a} and {b}"}], "temperature": i % 2, "seed": i,
               "max_tokens": 24, "stream": True} for i, (a, b) in enumerate(zip("abcdefghijklmnop", "zyxwvutsrqponmlk"))]
    alone = [stream_text(url, b) for b in bodies]
    assert len(set(alone)) >= 12  # a mix-up between requests would show
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        together = list(pool.map(lambda b: stream_text(url, b), bodies))
    assert together == alone


def test_a_client_that_leaves_mid_stream_frees_its_place_at_once(slow):
    headers = {"Authorization": f"Bearer {KEY}"}
    body = json.dumps({"prompt": "abc", "max_tokens": 64, "temperature": 0, "stream": True})
    sock = socket.create_connection(("127.0.0.1", slow.port), timeout=10)
    sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode())
    received = b""
    for _ in range(20):  # the headers, then the first event
        received += sock.recv(4096)
        if b"data: " in received:
            break
    assert b"data: " in received  # streaming: 64 tokens at 40 ms would hold the one place ~2.6 s
    busy = post(slow.url + "/v1/completions", {"prompt": "b", "max_tokens": 1}, headers)
    assert busy[0] == 503 and busy[1]["error"]["code"] == "server_overloaded"  # queue_size 1: refused at once
    sock.close()
    left = time.monotonic()
    while get(slow.url + "/health")[1]["busy"] and time.monotonic() - left < 5:
        time.sleep(0.02)
    assert time.monotonic() - left < 1.0  # the next token's check cut it
    assert post(slow.url + "/v1/completions", {"prompt": "b", "max_tokens": 1}, headers)[0] == 200


def test_the_key_is_required_when_set_and_a_plain_model_has_no_chat(slow):
    assert get(slow.url + "/v1/models")[0] == 401
    status, reply = post(slow.url + "/v1/completions", {"prompt": "b", "max_tokens": 1},
                         {"Authorization": "Bearer wrong"})
    assert status == 401 and reply["error"]["type"] == "authentication_error"
    assert get(slow.url + "/health")[0] == 200  # health needs no key
    with pytest.raises(openai.AuthenticationError):
        client(slow).models.list()
    with pytest.raises(openai.BadRequestError, match="not a chat model"):
        client(slow, KEY).chat.completions.create(model=slow.name, messages=[{"role": "user", "content": "hi"}])
    assert client(slow, KEY).completions.create(model=slow.name, prompt="ab", max_tokens=2).usage.completion_tokens == 2


def test_sigterm_cuts_an_open_stream_and_exits_0(slow):  # the last test of this server
    r = post_stream(slow.url + "/v1/completions", {"prompt": "abc", "max_tokens": 64, "stream": True},
                    {"Authorization": f"Bearer {KEY}"})
    assert r.readline().startswith(b"data: ")
    t0 = time.monotonic()
    code, err = slow.stop()
    rest = r.read().decode()
    assert code == 0 and "Traceback" not in err and err.rstrip().endswith("stopped"), err
    assert time.monotonic() - t0 < 10 and '"code": "cancelled"' in rest and rest.rstrip().endswith("data: [DONE]")


def test_a_port_in_use_is_one_line_before_the_model_loads(checkpoints, server):
    import subprocess
    import sys

    from repo import REPO

    def run(*args):
        return subprocess.run([sys.executable, str(REPO / "serve.py"), *args], cwd=REPO, capture_output=True,
                              text=True, timeout=60)

    r = run(f"--ckpt={checkpoints[0]}", f"--port={server.port}")  # the port is taken
    assert r.returncode == 2 and r.stderr.strip().endswith("pick another --port"), r.stderr


def test_a_reachable_server_without_a_key_warns_in_one_line():
    assert exposure_warning("127.0.0.1", None) is None and exposure_warning("::1", None) is None
    assert exposure_warning("0.0.0.0", "k") is None
    line = exposure_warning("0.0.0.0", None)
    assert line.startswith("warning: serving on 0.0.0.0 without an API key") and "\n" not in line
