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


def spelled(lp):
    """(tokens joined, whether text_offset counts each token's start) of a completions logprobs object."""
    starts = [sum(len(t) for t in lp["tokens"][:i]) for i in range(len(lp["tokens"]))]
    assert len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["tokens"])
    return "".join(lp["tokens"]), lp["text_offset"] == starts


def streamed(server, path, body):
    """The chunks' choices of a streamed request, in order."""
    import urllib.request

    request = urllib.request.Request(f"{server.url}/v1/{path}", data=json.dumps({**body, "stream": True}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as r:
        events = [line[5:].strip() for line in r.read().decode().splitlines() if line.startswith("data:")]
    return [choice for e in events[:-1] for choice in json.loads(e)["choices"]]


@pytest.mark.parametrize("cut", [(2, 3), (5, 7), (9, 12), (0, 1)])  # where in the full reply the stop string is
def test_logprobs_spell_exactly_the_text_a_stop_string_cut(server, cut):
    """The tokens of the stop string, and those held back as its possible start, are not in
    `logprobs`: chat and completions, whole and streamed, the tokens spell the reply."""
    prompt, first = {"prompt": "the dog", "temperature": 0, "max_tokens": 30}, {"messages": [
        {"role": "user", "content": "the dog"}], "temperature": 0, "max_tokens": 30}
    for path, body, options in (("completions", prompt, {"logprobs": 2}),
                                ("chat/completions", first, {"logprobs": True, "top_logprobs": 2})):
        status, full = post(f"{server.url}/v1/{path}", {**body, **options})
        text = full["choices"][0].get("text", full["choices"][0].get("message", {}).get("content"))
        stop = text[cut[0]:cut[1]]
        assert status == 200 and len(text) >= 12 and stop, full
        status, reply = post(f"{server.url}/v1/{path}", {**body, **options, "stop": [stop, "\x00"]})
        choice = reply["choices"][0]
        chunks = streamed(server, path, {**body, **options, "stop": stop})
        if path == "completions":
            assert choice["text"] == text[: text.index(stop)] and choice["finish_reason"] == "stop"
            assert spelled(choice["logprobs"]) == (choice["text"], True)
            assert "".join(c["text"] for c in chunks) == choice["text"]
            tokens = [t for c in chunks if c["logprobs"] for t in c["logprobs"]["tokens"]]
            offsets = [o for c in chunks if c["logprobs"] for o in c["logprobs"]["text_offset"]]
            assert tokens == choice["logprobs"]["tokens"] and offsets == choice["logprobs"]["text_offset"]
        else:
            content = choice["message"]["content"]
            assert content == text[: text.index(stop)] and choice["finish_reason"] == "stop"
            assert "".join(t["token"] for t in choice["logprobs"]["content"]) == content
            assert "".join(c["delta"].get("content") or "" for c in chunks) == content
            tokens = [t["token"] for c in chunks if c["logprobs"] for t in c["logprobs"]["content"]]
            assert "".join(tokens) == content


def test_a_developer_message_is_the_system_message(server):
    """Newer OpenAI clients send the system prompt as role "developer": the same reply as "system"."""
    def reply(role):
        messages = [{"role": role, "content": "be brief."}, {"role": "user", "content": "hello there"}]
        status, body = post(server.url + "/v1/chat/completions",
                            {"messages": messages, "temperature": 0, "max_tokens": 12})
        assert status == 200, body
        return body["choices"][0]["message"]["content"], body["usage"]["prompt_tokens"]

    system, developer = reply("system"), reply("developer")
    assert developer == system and system[1] == 1 + 9 + 1 + 1 + 11 + 1 + 1  # the system turn is in the prompt


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
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "developer", "content": "x"}]}, "chat", 400,
     "a developer message: only the first", "messages[1].role"),
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
    sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
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


def test_a_place_is_free_again_when_the_reply_ends(slow):
    """With --queue_size=1, one client's back-to-back requests never meet a 503 from its own
    last request: the place is given back before the reply's last byte is sent."""
    headers = {"Authorization": f"Bearer {KEY}"}
    for _ in range(25):
        status, reply = post(slow.url + "/v1/completions", {"prompt": "b", "max_tokens": 1}, headers)
        assert status == 200, reply
        r = post_stream(slow.url + "/v1/completions", {"prompt": "b", "max_tokens": 1, "stream": True}, headers)
        assert r.read().rstrip().endswith(b"data: [DONE]")


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


def test_sixteen_openai_clients_of_mixed_lengths_get_their_replies_alone(server):
    """Temperature 0, prompts of 1 to 40 characters, max_tokens 3 to 40, streamed and not,
    chat and completions: every reply served in one batch equals the same request alone."""
    c = client(server)

    def ask(i):
        words = ("the cat sat on the mat and ran away " * 2)[: 1 + (i * 7) % 40]
        options = dict(model="tiny-chat", temperature=0, max_tokens=3 + (i * 11) % 38, stop=["zq", "xx"])
        if i % 2:
            if i % 4 == 1:
                return chat(server, [{"role": "user", "content": words}], max_tokens=options["max_tokens"],
                            stop=["zq", "xx"]).choices[0].message.content
            return "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
                messages=[{"role": "user", "content": words}], stream=True, **options) if ch.choices)
        if i % 4 == 0:
            return c.completions.create(prompt=words, **options).choices[0].text
        return "".join(ch.choices[0].text for ch in c.completions.create(prompt=words, stream=True, **options)
                       if ch.choices)

    alone = [ask(i) for i in range(16)]
    assert len(set(alone)) >= 12
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        together = list(pool.map(ask, range(16)))
    assert together == alone


def test_n_logprobs_stop_lists_and_seeds_through_the_openai_client(server):
    c = client(server)
    messages = [{"role": "user", "content": "tell me a story"}]
    many = c.chat.completions.create(model="tiny-chat", messages=messages, n=3, temperature=1, seed=40,
                                     max_tokens=15, logprobs=True, top_logprobs=2)
    assert [ch.index for ch in many.choices] == [0, 1, 2]
    for i, choice in enumerate(many.choices):  # choice i: the reply seed + i gives alone
        one = c.chat.completions.create(model="tiny-chat", messages=messages, temperature=1, seed=40 + i,
                                        max_tokens=15)
        assert choice.message.content == one.choices[0].message.content
        content = choice.logprobs.content
        assert "".join(t.token for t in content) == choice.message.content
        for t in content:
            assert len(t.top_logprobs) == 2 and t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob
            assert t.logprob <= t.top_logprobs[0].logprob + 1e-6 and t.bytes == list(t.token.encode())
    assert many.usage.completion_tokens == sum(len(ch.logprobs.content) + (ch.finish_reason == "stop")
                                               for ch in many.choices)
    full = c.completions.create(model="tiny-chat", prompt="the dog", max_tokens=30, temperature=0, logprobs=3)
    text, lp = full.choices[0].text, full.choices[0].logprobs
    assert "".join(lp.tokens) == text and len(lp.token_logprobs) == len(lp.top_logprobs) == len(text)
    assert lp.text_offset == list(range(len(text))) and all(len(top) == 3 for top in lp.top_logprobs)
    assert all(p == max(top.values()) for p, top in zip(lp.token_logprobs, lp.top_logprobs))  # greedy: the best
    a, b = text[8:10], text[4:6]
    cut = c.completions.create(model="tiny-chat", prompt="the dog", max_tokens=30, temperature=0, stop=[a, b])
    assert cut.choices[0].text == text[: min(text.index(a), text.index(b))]
    assert cut.choices[0].finish_reason == "stop"
    streamed = [ch for ch in c.completions.create(model="tiny-chat", prompt="the dog", max_tokens=30, temperature=0,
                                                  stream=True, n=2, logprobs=1) if ch.choices]
    for i in range(2):
        mine = [ch.choices[0] for ch in streamed if ch.choices[0].index == i]
        assert "".join(ch.text for ch in mine) == text
        assert [t for ch in mine if ch.logprobs for t in ch.logprobs.tokens] == lp.tokens
    with pytest.raises(openai.BadRequestError, match="'tools' is not supported") as e:
        c.chat.completions.create(model="tiny-chat", messages=messages, tools=[
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}])
    assert e.value.body["param"] == "tools" and e.value.body["code"] == "unsupported_parameter"


@pytest.fixture(scope="module")
def queued(checkpoints):
    """The plain model at 40 ms a token, one reply generating at a time, one more waiting."""
    s = Server(f"--ckpt={checkpoints[1]}", "--queue_size=2", "--max_batch=1",
               env={"GPT_FAULTS": "token_delay=0.04"})
    yield s
    s.stop()


def raw_request(port, body):
    """A socket that has sent a POST to /v1/completions and reads nothing."""
    data = json.dumps(body)
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n{data}".encode())
    return sock


def wait_busy(server, busy, within):
    """Seconds until /health says `busy` requests are admitted (AssertionError past `within`)."""
    t0 = time.monotonic()
    while get(server.url + "/health")[1]["busy"] != busy:
        assert time.monotonic() - t0 < within, f"still not {busy} busy after {within} s"
        time.sleep(0.01)
    return time.monotonic() - t0


def test_clients_that_leave_waiting_or_running_without_streaming_free_their_place_at_once(queued):
    running = raw_request(queued.port, {"prompt": "abc", "max_tokens": 200, "temperature": 0})
    wait_busy(queued, 1, 5)
    waiting = raw_request(queued.port, {"prompt": "abc", "max_tokens": 200, "temperature": 0})
    wait_busy(queued, 2, 5)
    assert post(queued.url + "/v1/completions", {"prompt": "b", "max_tokens": 1})[0] == 503  # both places taken
    waiting.close()  # it waits for the one row: its place is free the moment it leaves
    assert wait_busy(queued, 1, 2) < 0.5
    time.sleep(0.3)
    running.close()  # 200 tokens at 40 ms: 8 s more if it were not noticed
    assert wait_busy(queued, 0, 2) < 0.5
    assert post(queued.url + "/v1/completions", {"prompt": "b", "max_tokens": 2})[0] == 200
    status, reply = post(queued.url + "/v1/completions", {"prompt": "b", "max_tokens": 2, "n": 2})
    assert status == 400 and "--max_batch" in reply["error"]["message"] and reply["error"]["param"] == "n"




@pytest.mark.parametrize("chat", [True, False])
def test_a_streams_text_chunks_are_the_bytes_of_json_dumps_of_its_chunk_objects(chat):
    """api.TextChunks encodes only the text, time and log-probabilities per token; every
    chunk must still be what json.dumps of api.chat_chunk / completion_chunk gives."""
    from gptkit.serve import api

    rid, model = 'chatcmpl-"\\x', "m\u00e9del \u2028\n"
    chunks = api.TextChunks(rid, model, chat)
    logprobs = [None, [], api.chat_logprobs([("\u00e9", -0.123456789, [("a", -1e-9), ("\"", -30.5)])]),
                api.completion_logprobs([("\n", -2.0, [("b", -0.5)])], 7)]
    for text in ["", "7", 'say "hi"\\ \t\x00\x7f', "\u00e9\u4e2d\ud83d\ude00", "\U0001f600", " " * 40]:
        for index in (0, 15):
            for lp in logprobs:
                fields = dict(index=index, logprobs=lp)
                expected = (api.chat_chunk(rid, model, {"content": text}, **fields) if chat
                            else api.completion_chunk(rid, model, text, **fields))
                got = chunks(index, text, lp)
                expected["created"] = json.loads(got)["created"]  # a second may have passed between
                assert got == json.dumps(expected)
