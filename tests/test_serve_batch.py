"""serve.py's continuous batching, in process: requests of different lengths and settings
that join and leave one running batch each get the reply gptkit/generation/generate.py's
generate_samples (sample.py's loop, model.py's plain KVCache, one request alone) gives."""

import dataclasses
import threading
import time

import pytest
import torch
from serve_helpers import write_checkpoint

from gptkit.generation import chat_session
from gptkit.generation.generate import generate_samples
from gptkit.models.loading import load_model
from gptkit.serve import api
from gptkit.serve.worker import Job, Worker

BASE = api.Sampling(max_new_tokens=20, temperature=0.0, top_k=None, top_p=None, min_p=None, repetition_penalty=1.0,
                    stop=None, seed=0, compile=False, cpu_decode=False, dtype="float32")


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("batch")
    model, tokenizer, _ = load_model(ckpt=str(write_checkpoint(tmp / "chat.pt", block_size=64)))
    return model, tokenizer


def collect(job):
    """Give `job` an emit that gathers its events; returns (events, a threading.Event set at the end)."""
    events, ended = [], threading.Event()

    def emit(kind, value):
        events.append((kind, value))
        if kind in ("done", "error"):
            ended.set()
    job.emit = emit
    return events, ended


def texts(events, n=1):
    out = [""] * n
    for kind, value in events:
        if kind == "text":
            out[value["index"]] += value["text"]
    return out


def alone(model, tokenizer, job, worker):
    """The reply generate_samples (sample.py's code) gives the request alone."""
    if job.messages is not None:
        session = chat_session.Session(model, tokenizer, None, [dict(m) for m in job.messages[:-1]])
        return chat_session.reply(session, job.messages[-1]["content"], job.settings, torch.device("cpu"))
    return generate_samples(model, tokenizer, job.prompt, job.settings, torch.device("cpu"),
                            stop_tokens=worker.plain_stops)[0]


def mixed_jobs(tokenizer):
    """16 requests: prompt lengths 1 to 60 (past block_size 64 with their replies: the
    context shifts), max_tokens 1 to 40, greedy and seeded sampling, filters, stop lists."""
    jobs = []
    for i in range(16):
        words = " ".join(["the cat sat", "a dog ran far away", "hello", "on the mat and more"][i % 4] for _ in
                         range(1 + i % 3))
        settings = dataclasses.replace(
            BASE, max_new_tokens=[1, 40, 7, 25][i % 4], seed=100 + i,
            temperature=[0.0, 0.0, 0.9, 1.3][i // 4], top_k=[None, 5][i % 2], top_p=[None, 0.9][i // 8],
            repetition_penalty=[1.0, 1.3][(i // 2) % 2], stop=(("zz", " th"), None)[i % 2])
        if i % 3 == 0:
            jobs.append(Job(settings, None, messages=[{"role": "user", "content": words[:30]}]))
        else:
            jobs.append(Job(settings, None, prompt=tokenizer.encode((words * 4)[: 1 + 4 * i])))
    return jobs


def test_sixteen_mixed_requests_joining_a_running_batch_equal_their_replies_alone(loaded):
    model, tokenizer = loaded
    worker = Worker(model, tokenizer, torch.device("cpu"), capacity=32, max_batch=16)
    sizes = []
    step = worker.batch.step

    def counted():
        sizes.append(len(worker.batch))
        return step()
    worker.batch.step = counted
    jobs = mixed_jobs(tokenizer)
    gathered = [collect(job) for job in jobs]
    worker.start()
    try:
        for k, job in enumerate(jobs):  # in two waves: the second joins a batch already running
            worker.submit(job)
            if k == 7:
                assert gathered[0][1].wait(30)
        for _, ended in gathered:
            assert ended.wait(60)
    finally:
        worker.stop()
        worker.join(10)
    assert max(sizes) >= 8 and len(set(sizes)) > 3  # rows came and went while others ran
    lengths = [events[0][1]["prompt_tokens"] + events[-1][1]["completion_tokens"] for events, _ in gathered]
    assert max(lengths) > 64  # a reply went past block_size: its context shifted in the batch
    replies = [texts(events)[0] for events, _ in gathered]
    assert len(set(replies)) >= 12
    for job, (events, _), reply in zip(jobs, gathered, replies):
        assert events[-1][0] == "done", events[-1]
        assert reply == alone(model, tokenizer, job, worker), job
    assert worker.busy() == 0


def test_n_choices_are_the_replies_of_successive_seeds_and_logprobs_are_the_models(loaded):
    model, tokenizer = loaded
    worker = Worker(model, tokenizer, torch.device("cpu"), capacity=4, max_batch=4)
    ids = tokenizer.encode("the cat sat")
    settings = dataclasses.replace(BASE, temperature=1.0, max_new_tokens=12, seed=7)
    job = Job(settings, None, prompt=ids, n=3, top_logprobs=4)
    events, ended = collect(job)
    worker.start()
    try:
        worker.submit(job)
        assert ended.wait(30)
    finally:
        worker.stop()
        worker.join(10)
    choices = texts(events, 3)
    for i, text in enumerate(choices):
        assert text == generate_samples(model, tokenizer, ids, dataclasses.replace(settings, seed=7 + i),
                                        torch.device("cpu"), stop_tokens=worker.plain_stops)[0]
    assert len(set(choices)) > 1
    entries = [e for kind, v in events if kind == "text" and v["index"] == 1 for e in v["logprobs"]]
    tokens = tokenizer.encode("".join(t for t, _, _ in entries))
    assert "".join(t for t, _, _ in entries) == choices[1] and len(tokens) == len(entries) >= 3
    with torch.no_grad():  # the whole sequence in one plain forward: the model's log-softmax at each step
        logits, _ = model(torch.tensor([ids + tokens]))
    logp = torch.log_softmax(logits[0, len(ids) - 1 :].float(), dim=-1)  # (tokens + 1, vocab)
    for (text, lp, top), row, token in zip(entries, logp, tokens):
        assert lp == pytest.approx(float(row[token]), abs=1e-4)
        best = torch.topk(row, 4)
        assert [t for t, _ in top] == [worker._text(i) for i in best.indices.tolist()]
        assert [p for _, p in top] == pytest.approx(best.values.tolist(), abs=1e-4)


def test_a_reply_that_fails_mid_batch_ends_alone_and_the_others_go_on(loaded, capsys):
    model, tokenizer = loaded
    worker = Worker(model, tokenizer, torch.device("cpu"), capacity=4, max_batch=4)
    ids = tokenizer.encode("a dog ran")
    good = [Job(dataclasses.replace(BASE, max_new_tokens=15, seed=s, temperature=1.0), None, prompt=ids)
            for s in (1, 2)]
    bad = Job(dataclasses.replace(BASE, max_new_tokens=15, stop=(5,)), None, prompt=ids)  # not a string: fails
    gathered = [collect(job) for job in (good[0], bad, good[1])]
    worker.start()
    try:
        for job in (good[0], bad, good[1]):
            worker.submit(job)
        for _, ended in gathered:
            assert ended.wait(30)
    finally:
        worker.stop()
        worker.join(10)
    kind, (status, message, code) = gathered[1][0][-1]
    assert kind == "error" and status == 500 and code == "server_error" and "TypeError" not in message
    assert "Traceback" in capsys.readouterr().err  # the log has it, the client one line
    for job, (events, _) in zip(good, (gathered[0], gathered[2])):
        assert events[-1][0] == "done" and texts(events)[0] == alone(model, tokenizer, job, worker)
    assert worker.busy() == 0


@pytest.fixture
def running_loop():
    """An asyncio loop running in a thread of its own, as uvicorn's is beside the worker;
    its call_soon_threadsafe counted (each is a wake-up of the loop)."""
    import asyncio

    loop = asyncio.new_event_loop()
    wakes = []
    plain = loop.call_soon_threadsafe
    loop.call_soon_threadsafe = lambda *a: (wakes.append(a), plain(*a))[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop, wakes
    plain(loop.stop)
    thread.join(5)
    loop.close()


def arrived(queues, sizes, timeout=5):
    deadline = time.monotonic() + timeout
    while [q.qsize() for q in queues] != sizes and time.monotonic() < deadline:
        time.sleep(0.001)
    return [q.qsize() for q in queues] == sizes


def test_a_steps_events_reach_their_queues_after_it_in_one_wake_up(running_loop):
    import asyncio

    from gptkit.serve.app import Mailbox

    loop, wakes = running_loop
    box = Mailbox(loop)
    queues = [asyncio.Queue() for _ in range(16)]
    with box.step():  # the worker's thread, as Worker._loop runs it
        for i, queue in enumerate(queues):
            box.post(queue, ("text", i))
            box.post(queue, ("done", i))
        time.sleep(0.05)  # a loop free to run would have had time to take them
        assert all(q.empty() for q in queues), "events reached the loop during the step"
    assert arrived(queues, [2] * 16)
    assert [(q.get_nowait(), q.get_nowait()) for q in queues] == [(("text", i), ("done", i)) for i in range(16)]
    assert len(wakes) == 1
    with box.step():  # a step that made no event: no wake-up
        pass
    box.post(queues[0], ("error", "cancelled"))  # outside a step (a cancel): at once
    assert arrived(queues[:1], [1]) and queues[0].get_nowait() == ("error", "cancelled")
    assert len(wakes) == 2


def test_the_workers_step_holds_back_the_events_of_every_loops_mailbox(running_loop):
    """Mailboxes.step, which serve.py passes to the Worker as around_step: the events of a
    step wait for its end in each event loop's mailbox, and the mailbox of a loop is made
    once (the app asks for it per request)."""
    import asyncio

    from gptkit.serve.app import Mailboxes

    loop, wakes = running_loop
    mailboxes = Mailboxes()
    box = mailboxes.of(loop)
    assert mailboxes.of(loop) is box
    queue = asyncio.Queue()
    with mailboxes.step():
        box.post(queue, ("text", 0))
        time.sleep(0.05)
        assert queue.empty(), "an event reached the loop during the step"
    assert arrived([queue], [1]) and len(wakes) == 1


def test_a_steps_later_tokens_wait_for_the_stream_interval_but_first_tokens_and_ends_do_not(running_loop):
    """With --stream_interval, a step whose events are all later tokens of their replies
    wakes the loop only once the interval has passed since the last wake-up (one stream
    then pays one wake-up per interval, not per token); a reply's first token, its end
    and events outside a step still wake it at once, and nothing held is lost."""
    import asyncio

    from gptkit.serve.app import Events, Mailbox

    loop, wakes = running_loop
    box = Mailbox(loop, interval=0.2)
    queue = asyncio.Queue()
    events = Events(box)
    events.put_nowait = queue.put_nowait  # count what the loop receives
    with box.step():
        events.emit("text", "first")
    assert arrived([queue], [1]) and len(wakes) == 1  # the first token: at once
    for i in range(5):  # later tokens, steps 10 ms apart: held for the interval
        with box.step():
            events.emit("text", i)
        time.sleep(0.01)
    assert len(wakes) == 1 and queue.qsize() == 1
    time.sleep(0.2)
    with box.step():
        events.emit("text", 5)
    assert arrived([queue], [7]) and len(wakes) == 2  # the interval passed: all six in one wake-up
    with box.step():
        events.emit("text", 6)
    assert len(wakes) == 2
    with box.step():
        events.emit("done", None)  # the reply's end goes at once, with the token held before it
    assert arrived([queue], [9]) and len(wakes) == 3
    items = [queue.get_nowait() for _ in range(9)]
    assert items == [("text", "first"), *[("text", i) for i in range(7)], ("done", None)]
    again = Mailbox(loop)  # interval 0 (the default): every step's events wake the loop
    with again.step():
        again.post(queue, ("text", 7), urgent=False)
    assert arrived([queue], [1]) and len(wakes) == 4


def test_events_for_a_loop_that_has_closed_are_dropped_quietly():
    import asyncio

    from gptkit.serve.app import Mailbox

    loop = asyncio.new_event_loop()
    loop.close()  # the server has stopped: nobody is listening
    box = Mailbox(loop)
    box.post(asyncio.Queue(), ("error", "cancelled"))
    with box.step():
        box.post(asyncio.Queue(), ("text", 0))


def test_a_stream_writes_at_most_once_per_interval_the_first_token_at_once_and_every_event():
    """EventStream with --stream_interval: 20 tokens 5 ms apart go out in a few writes
    (none closer than the interval, the first at once, every token in order); at 0 each
    token that came alone goes out alone; a token after a pause never waits for the next,
    and the reply's end never waits out the interval."""
    import asyncio

    from gptkit.serve.app import SEND, EventStream, Events, paced

    class Job:
        def cancel(self):
            pass

    async def stream(interval, gaps, end_gap=0.0):
        events, writes = Events(None), []
        start = asyncio.get_running_loop().time()

        async def produce():
            for i, gap in enumerate(gaps):
                await asyncio.sleep(gap)
                events.put_nowait(("text", str(i)))
            if end_gap:
                await asyncio.sleep(end_gap)
            events.put_nowait(("done", None))

        async def chunks():  # as app.py's: SEND passed on, each text event one chunk
            async for event in paced(events):
                if event is SEND:
                    yield SEND
                elif event[0] == "done":
                    yield "[DONE]"
                    return
                else:
                    yield event[1]

        async def send(message):
            if message["type"] == "http.response.body":
                writes.append((asyncio.get_running_loop().time() - start, message["body"].decode()))

        watcher = asyncio.ensure_future(asyncio.sleep(10))
        producer = asyncio.ensure_future(produce())
        await EventStream(chunks(), events, Job(), watcher, interval)(None, None, send)
        await producer
        return writes

    def tokens(writes):
        return [line[len("data: "):] for _, body in writes for line in body.split("\n\n") if line]

    writes = asyncio.run(stream(0.05, [0.005] * 20))
    assert tokens(writes) == [str(i) for i in range(20)] + ["[DONE]"]
    assert writes[0][0] < 0.04 and writes[0][1] == "data: 0\n\n"  # the first token at once
    sends = [t for t, body in writes if body]
    assert all(b - a >= 0.045 for a, b in zip(sends, sends[1:-1])), sends  # the last: the reply's end
    assert 2 <= len(sends) <= 5, writes
    writes = asyncio.run(stream(0.0, [0.01] * 5))
    assert [body for _, body in writes] == [f"data: {i}\n\n" for i in range(4)] + ["data: 4\n\ndata: [DONE]\n\n"]
    writes = asyncio.run(stream(0.05, [0.005, 0.005, 0.3]))  # token 1 must not wait 0.3 s for token 2
    assert [body for _, body in writes][:2] == ["data: 0\n\n", "data: 1\n\n"] and writes[1][0] < 0.1, writes
    writes = asyncio.run(stream(0.5, [0.005, 0.01], 0.01))  # token 1, then the end, soon after token 0's write
    assert tokens(writes) == ["0", "1", "[DONE]"] and writes[-1][0] < 0.25, writes  # not 0.5 s after it


@pytest.mark.parametrize("variant", [{}, {"pos_encoding": "sinusoidal"},
                                     {"pos_encoding": "rope", "qk_norm": True, "norm": "rmsnorm", "mlp": "relu2"},
                                     {"norm": "rmsnorm", "mlp": "swiglu", "pos_encoding": "rope", "n_kv_head": 2},
                                     {"pos_encoding": "none", "norm_placement": "post", "logit_softcap": 15.0},
                                     {"attention": "reference"}])
@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
def test_model_py_as_written_batches_as_it_runs_alone_for_every_variant_and_part(variant, dtype):
    """serve.py's start-up check passes on model.py as written: every position encoding,
    norm, MLP and attention, with each of gptkit/fast/cpu_linears.py's parts swapped in; and it
    fails where a row's logits beside others are not its own (a model whose attention
    ignores the padding mask)."""
    from gptkit.generation.generate import prepare_for_generating
    from gptkit.serve.batch import batching_differs
    from model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=64, block_size=32, vocab_size=50, **variant)).eval()
    with torch.no_grad():  # sharper than the 0.02 init: logits that differ show it
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8)
    prepare_for_generating(model, dtype, torch.device("cpu"), cpu_decode=True,
                           note=lambda line: None)
    assert batching_differs(model, torch.device("cpu")) is None
    for block in model.transformer.h:  # every query sees every column: another row's padding too
        block.attn.forward = lambda x, cache=None, layer=0, attn=block.attn: ignoring_mask(attn, x, cache, layer)
    assert "beside others gets logits" in batching_differs(model, torch.device("cpu"))


def ignoring_mask(attn, x, cache, layer):
    B, T, C = x.shape
    q, k, v = attn.qkv(x, cache.length if cache is not None else 0)
    if cache is not None:
        k, v = cache.update(layer, k, v)
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=T > 1, enable_gqa=True)
    return attn.c_proj(y.transpose(1, 2).reshape(B, T, C))


class BytePieces:
    """A tokenizer of byte strings, as BPE's: a token may hold several characters, or half of one."""

    def __init__(self, pieces):
        self.pieces, self.vocab_size, self.eot_id = pieces, len(pieces), None

    def decode(self, ids):
        return b"".join(self.pieces[i] for i in ids).decode("utf-8", errors="replace")


FULL = "hello woréld"  # BytePieces(PIECES) of every token in turn
PIECES = [b"he", b"llo w", b"or", "é".encode()[:1], "é".encode()[1:], b"ld"]


@pytest.mark.parametrize("stop, want", [
    ("lo w", ["he", "l"]),          # the cut falls inside a token: it keeps "l", the rest is dropped
    ("oré", ["he", "llo w"]),       # the stop string ends in a character split over two tokens
    ("é", ["he", "llo w", "or"]),   # the cut before a split character: both its tokens dropped
    ("ld", ["he", "llo w", "or", "\ufffd", "\ufffd"]),  # (each half of é alone decodes to U+FFFD)
    ("zz", ["he", "llo w", "or", "\ufffd", "\ufffd", "ld"]),  # no stop: every token
])
def test_log_probabilities_go_out_with_the_text_they_made_and_stop_at_the_cut(stop, want):
    """worker.TokenEntries over BPE-like tokens: whatever the tokens' edges, no entry goes
    out before the text it made, and at the end the tokens spell the text a stop string
    cut (a token the cut falls in keeps its part of the text)."""
    from gptkit.generation.generate import TextStream
    from gptkit.serve.worker import TokenEntries

    tokenizer = BytePieces(PIECES)
    stream, entries, out, text = TextStream(tokenizer, stop, stop_tokens=[]), TokenEntries(), [], ""
    for token in range(len(PIECES)):
        stream.push(token)
        finished = stream.stopped or token == len(PIECES) - 1
        if finished:
            stream.close()
        text += stream.take_new()
        entries.add(len(stream.text), tokenizer.decode([token]), -1.0 * token, [])
        out += [t for t, _, _ in entries.take(stream.shown, stream.text if finished else None)]
        assert len("".join(out).replace("\ufffd", "")) <= len(text), (out, text)  # never ahead of the text
        if finished:
            break
    assert text == FULL[: FULL.find(stop)] if stop in FULL else text == FULL
    assert out == want
