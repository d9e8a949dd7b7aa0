"""serve.py's HTTP side: a Starlette app with OpenAI's endpoints, the chat page, and
the uvicorn server that runs it until SIGINT or SIGTERM.

    GET  /                      the chat page (gptkit/serve/page.html)
    GET  /health                {"status": "ok", ...}: no key needed
    GET  /v1/models             the one model served
    POST /v1/chat/completions   chat models only: the template of gptkit/data/chat.py
    POST /v1/completions        any model: a plain continuation of `prompt`

Streams are server-sent events in OpenAI's chunk format, ending with `data: [DONE]`.
Each request joins the generation worker's batch (gptkit/serve/worker.py); the event
loop only reads requests, writes what the worker makes, and tells the worker at once
when a client leaves (watch_disconnect).
"""

import asyncio
import collections
import contextlib
import hmac
import json
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect
from starlette.responses import HTMLResponse, JSONResponse
from starlette.routing import Route

from gptkit.serve import api
from gptkit.serve.api import ApiError
from gptkit.serve.guard import (LISTEN_BACKLOG, HostGuard, QuietAcceptErrors, connection_limit, refusal,
                                timed_protocol)
from gptkit.serve.worker import Job, Overloaded

PAGE = Path(__file__).resolve().parent / "page.html"
KEEP_ALIVE_S = 5  # an idle connection kept open after a reply is closed after this long (uvicorn's default)


def error_response(status, message, type=None, param=None, code=None, headers=None):
    return JSONResponse(api.error_body(message, type or api.ERROR_TYPES.get(status, "invalid_request_error"),
                                       param, code), status_code=status, headers=headers)


def api_error_response(e):
    headers = {"Retry-After": "1"} if e.status == 503 else None
    return error_response(e.status, e.message, e.type, e.param, e.code, headers)


DRAIN_FACTOR = 8  # an oversized body up to this many times the limit is read (and dropped) first


def check_json_type(request):
    """ApiError 415 unless the body is declared JSON. A web page on another site can make a
    browser POST text/plain, a form or no type at all without asking this server first;
    application/json it can send only after a CORS preflight, which this server never grants."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != "application/json":
        shown = f"{media_type!r}"[:60] if media_type else "none"
        raise ApiError(415, f"the request body must be sent as Content-Type: application/json, not {shown} "
                       "(serve.py --require_json=false takes any)", code="unsupported_media_type")


async def read_json(request, limit, require_json=True):
    """The request's JSON body, read up to `limit` bytes: ApiError 415 when it is not declared
    JSON (unless require_json is off), 413 past the limit, 400 for bad JSON."""
    if require_json:
        check_json_type(request)
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        if int(length) <= DRAIN_FACTOR * limit:  # read and drop it: a client still sending then
            async for _ in request.stream():      # reads the 413 instead of a broken pipe
                pass
        raise ApiError(413, f"the request body is {int(length):,} bytes, over the limit of {limit:,} bytes "
                       "(--max_body_bytes)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"the request body is over the limit of {limit:,} bytes (--max_body_bytes)")
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks), parse_int=api.parse_int)
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise ApiError(400, f"the request body is not JSON: {e}"[:300])
    except RecursionError:
        raise ApiError(400, "the request body is nested too deeply")


def worker_error(value):
    """The ApiError of a worker's ("error", (status, message, code)) event."""
    status, message, code = value
    return ApiError(status, message, type=api.ERROR_TYPES.get(status, "server_error"), code=code)


class Mailbox:
    """Events on their way from the worker thread to the event loop. Each
    call_soon_threadsafe writes to the loop's wake-up socket: a system call, the loop's
    thread woken, and Python's GIL handed over, then back to the worker. At 16 streams
    a step makes 16 events, so the events a step makes (`step()`, around it in the
    worker) wait here and reach their queues in one wake-up after it (measured: 7% less
    server CPU per token at 16 streams, benchmarks/LOG.md); events posted outside a
    step (a request's start, a cancel) wake the loop at once. A step whose events are
    all later tokens of their replies (not `urgent`: not a reply's first token, end,
    tool call or error) wakes the loop only where `interval` seconds (--stream_interval)
    have passed since the last wake-up, else leaves them to a later step's: the writes
    wait out that interval anyway (EventStream), and one stream no longer pays a
    wake-up, a task switch and the GIL handed over for each token (benchmarks/LOG.md)."""

    def __init__(self, loop, interval=0.0):
        self.loop, self.lock, self.interval = loop, threading.Lock(), interval
        self.posted = []  # (queue, event) for drain() to put, in order
        self.waking = False  # a drain is scheduled and has not run yet
        self.stepping = False  # the worker is in a step: posts wait for its end
        self.urgent = False  # posted since the last wake-up: an event that must not wait
        self.woken_at = float("-inf")  # time.monotonic() of the last wake-up

    def post(self, queue, event, urgent=True):  # from any thread
        with self.lock:
            self.posted.append((queue, event))
            self.urgent = self.urgent or urgent
            if self.stepping or self.waking:
                return
            self.waking = True
        self.wake()

    def wake(self):
        self.woken_at, self.urgent = time.monotonic(), False
        try:
            self.loop.call_soon_threadsafe(self.drain)
        except RuntimeError:
            pass  # the loop has closed: the server is gone, nobody is listening

    def drain(self):  # in the loop
        with self.lock:
            posted, self.posted, self.waking = self.posted, [], False
        for queue, event in posted:
            queue.put_nowait(event)

    @contextlib.contextmanager
    def step(self):
        """Around one step of the worker, in its thread: what it posts goes out after it."""
        with self.lock:
            self.stepping = True
        try:
            yield
        finally:
            with self.lock:
                self.stepping = False
                due = self.urgent or time.monotonic() - self.woken_at >= self.interval
                wake = bool(self.posted) and not self.waking and due
                self.waking = self.waking or wake
            if wake:
                self.wake()


class Mailboxes:
    """One Mailbox per event loop (a test client may run the app in several). The worker is
    built with `around_step=mailboxes.step` (gptkit/serve/server.py), so each of its steps
    holds back every loop's events until the step ends."""

    def __init__(self, interval=0.0):
        self.lock, self.by_loop, self.interval = threading.Lock(), {}, interval

    def of(self, loop):
        with self.lock:
            if loop not in self.by_loop:
                self.by_loop[loop] = Mailbox(loop, self.interval)
            return self.by_loop[loop]

    @contextlib.contextmanager
    def step(self):
        """Around one step of the worker, in its thread."""
        with self.lock:
            boxes = list(self.by_loop.values())
        with contextlib.ExitStack() as stack:
            for box in boxes:
                stack.enter_context(box.step())
            yield


class Events:
    """One job's events, handed from the worker thread to this request's task through
    the loop's Mailbox. Every job ends with a "done" or an "error" event, also when
    its client left. (A deque and one future, not an asyncio.Queue: a step's events
    for a stream reach it in one wake-up, and are then taken without awaiting.)"""

    def __init__(self, mailbox):
        self.mailbox, self.items, self.waiter = mailbox, collections.deque(), None
        self.ended = False  # the job's last event ("done" or "error") is here
        self.pausing = None  # the future pause() awaits
        self.texted = False  # a "text" event was emitted: the later ones may wait for the interval

    def emit(self, kind, value):  # called by the worker thread
        urgent = kind != "text" or not self.texted  # the first token (time to first token) goes at once
        self.texted = self.texted or kind == "text"
        self.mailbox.post(self, (kind, value), urgent)

    def put_nowait(self, event):  # in the loop: Mailbox.drain
        self.items.append(event)
        self.ended = self.ended or event[0] in ("done", "error")
        for future in (self.waiter, self.pausing if self.ended else None):
            if future is not None and not future.done():
                future.set_result(None)

    async def next(self):
        while not self.items:
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        return self.items.popleft()

    def waiting(self):
        """Whether next() would wait: no event is here yet."""
        return not self.items

    async def pause(self, seconds):
        """Wait `seconds`, or less where the job's last event comes meanwhile: the end of
        a reply goes out at once."""
        if self.ended:
            return
        loop = asyncio.get_running_loop()
        self.pausing = loop.create_future()
        timer = loop.call_later(seconds, lambda f=self.pausing: f.done() or f.set_result(None))
        try:
            await self.pausing
        finally:
            timer.cancel()
            self.pausing = None


def watch_disconnect(request, job):
    """A task that cancels `job` the moment the client's connection closes, whether the
    job waits for its turn or generates, streaming or not (the body is read by then, so
    the next ASGI message is the disconnect)."""
    async def watch():
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                job.cancel()
                return

    return asyncio.ensure_future(watch())


SEND = object()  # what `chunks` yields before it waits: the events so far go out now


async def paced(events):
    """A job's events as they come, with SEND before each wait for the next: the
    opening chunks go out with the first token's (one write, not two), and where
    EventStream's write waited out --stream_interval and nothing came meanwhile, a
    second SEND lets it go out then, not with the next token."""
    first = True
    while True:
        if events.waiting() and not first:
            yield SEND
            if events.waiting():
                yield SEND
        first = False
        yield await events.next()


class EventStream:
    """A server-sent events response written from a job's events. The events made
    while the loop was busy go out in one write (one system call, where a server behind
    on 16 streams would make one per token each), and after a write the next waits
    until `interval` seconds have passed (--stream_interval), so the tokens made
    meanwhile join it: the first token and the reply's end go out at once, the events
    themselves are the same. A send that fails (the client left) cancels the job at
    once, as the disconnect watcher does."""

    def __init__(self, chunks, events, job, watcher, interval=0.0):
        self.chunks, self.events, self.job, self.watcher = chunks, events, job, watcher
        self.interval = interval

    async def __call__(self, scope, receive, send):
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream; charset=utf-8"),
                                    (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]})
            body, loop, sent = [], asyncio.get_running_loop(), float("-inf")
            async for data in self.chunks:
                if data is not SEND:
                    body.append(f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n")
                elif body:
                    wait = sent + self.interval - loop.time()
                    if wait > 0 and not self.events.ended:  # too soon: the next tokens join this write
                        await self.events.pause(wait)
                        continue
                    await send({"type": "http.response.body", "body": "".join(body).encode(), "more_body": True})
                    body, sent = [], loop.time()
            await send({"type": "http.response.body", "body": "".join(body).encode(), "more_body": False})
        except (OSError, ClientDisconnect):
            pass  # the client left mid-stream
        finally:
            self.job.cancel()
            self.watcher.cancel()


def build_app(state):
    """The Starlette app. `state` holds cfg, worker, tokenizer, model_name, chat (turn ids or None),
    block_size, and the mailboxes the worker's steps are wrapped in."""
    cfg = state.cfg
    mailbox = state.mailboxes.of

    def authorize(request):
        if not state.api_key:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), state.api_key.encode()):
            raise ApiError(401, "a valid API key is needed: send the header 'Authorization: Bearer KEY'",
                           type="authentication_error", code="invalid_api_key")

    async def page(request):
        return HTMLResponse(PAGE.read_text(encoding="utf-8"), headers={"cache-control": "no-cache"})

    async def health(request):
        return JSONResponse({"status": "ok", "model": state.model_name, "busy": state.worker.busy(),
                             "capacity": state.worker.capacity})

    async def models(request):
        authorize(request)
        return JSONResponse({"object": "list", "data": [
            {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "gptkit",
             "chat": state.chat is not None, "context_length": state.block_size}]})

    async def chat_completions(request):
        authorize(request)
        body = await read_json(request, cfg.max_body_bytes, cfg.require_json)
        sampling, stream, include_usage, extras = api.check_common(
            body, state.model_name, state.max_tokens, state.max_tokens, cfg)
        if state.chat is None:
            raise ApiError(400, f"{state.model_name} is not a chat model (it has no turn tokens): use /v1/completions, "
                           "or fine-tune it on a chat dataset first (docs/chat.md)", param="model",
                           code="not_a_chat_model")
        messages = api.check_messages(body.get("messages"))
        n, top = api.check_choices(body, "chat")
        job = Job(sampling, None, messages=messages, n=n, top_logprobs=top)
        return await answer(request, job, "chat", stream, include_usage, extras)

    async def completions(request):
        authorize(request)
        body = await read_json(request, cfg.max_body_bytes, cfg.require_json)
        sampling, stream, include_usage, extras = api.check_common(
            body, state.model_name, state.max_tokens, api.COMPLETIONS_DEFAULT_MAX_TOKENS, cfg)
        prompt = api.check_prompt(body)
        n, top = api.check_choices(body, "text")
        from gptkit.ops.errors import UserError

        try:
            ids = state.tokenizer.encode(prompt)
        except UserError as e:
            raise ApiError(400, str(e), param="prompt")
        if not ids:
            if state.tokenizer.eot_id is None:
                raise ApiError(400, "the prompt is empty, and this model has no end-of-text token to start from",
                               param="prompt")
            ids = [state.tokenizer.eot_id]
        job = Job(sampling, None, prompt=ids, n=n, top_logprobs=top)
        return await answer(request, job, "text", stream, include_usage, extras)

    async def answer(request, job, kind, stream, include_usage, extras):
        if job.n > state.worker.max_batch:
            raise ApiError(400, f"n={job.n} is more than the {state.worker.max_batch} replies this server generates "
                           "at once (--max_batch)", param="n")
        events = Events(mailbox(asyncio.get_running_loop()))
        job.emit = events.emit
        try:
            state.worker.submit(job)
        except Overloaded as e:
            raise ApiError(503, str(e), type="server_error", code="server_overloaded")
        watcher = watch_disconnect(request, job)
        try:
            first = await events.next()
        except BaseException:
            job.cancel()
            watcher.cancel()
            raise
        if first[0] == "error":
            watcher.cancel()
            raise worker_error(first[1])
        start = first[1]
        rid = api.new_id("chatcmpl" if kind == "chat" else "cmpl")
        name = state.model_name
        chat = kind == "chat"
        if not stream:
            try:
                return await whole_reply(events, rid, name, chat, start, extras, job)
            finally:
                job.cancel()  # a no-op once it is done; a handler cut by an error must not leave it running
                watcher.cancel()

        async def chunks():
            gptkit = {**extras, "dropped_messages": start["dropped_messages"]}
            for index in range(job.n):
                yield api.chat_chunk(rid, name, {"role": "assistant", "content": ""}, index=index, gptkit=gptkit) \
                    if chat else api.completion_chunk(rid, name, "", index=index, gptkit=gptkit)
            offsets = [0] * job.n
            text_chunk = api.TextChunks(rid, name, chat)
            async for event in paced(events):
                if event is SEND:
                    yield SEND
                    continue
                what, value = event
                if what == "text":  # as api.chat_chunk / completion_chunk, encoded from a template
                    i, text, entries = value["index"], value["text"], value["logprobs"]
                    if chat:
                        yield text_chunk(i, text, entries and api.chat_logprobs(entries))
                    else:
                        yield text_chunk(i, text, entries and api.completion_logprobs(entries, offsets[i]))
                        offsets[i] += sum(len(t) for t, _, _ in entries or ())
                elif what == "tool":  # a calculator call ran: its output's text follows (docs/serve.md)
                    call = {"expression": value["expression"], "output": value["output"]}
                    yield api.chat_chunk(rid, name, {}, index=value["index"], gptkit={"tool_call": call})
                elif what == "error":
                    yield worker_error(value).body()
                    break
                else:
                    more = {"usage": None} if include_usage else {}
                    for i, choice in enumerate(value["choices"]):
                        reason = choice["finish_reason"]
                        yield api.chat_chunk(rid, name, {}, reason, index=i, **more) if chat \
                            else api.completion_chunk(rid, name, "", reason, index=i, **more)
                    if include_usage:
                        yield {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                               "created": 0, "model": name, "choices": [],
                               "usage": api.usage(start["prompt_tokens"], value["completion_tokens"])}
                    break
            yield "[DONE]"

        return EventStream(chunks(), events, job, watcher, state.cfg.stream_interval)

    async def whole_reply(events, rid, name, chat, start, extras, job):
        """The JSON reply of a request that does not stream, once its last choice is done."""
        texts, entries = [[] for _ in range(job.n)], [[] for _ in range(job.n)]
        calls = [[] for _ in range(job.n)]  # each choice's calculator calls, in gptkit.tool_calls
        while True:
            what, value = await events.next()
            if what == "text":
                texts[value["index"]].append(value["text"])
                entries[value["index"]] += value["logprobs"] or []
            elif what == "tool":
                calls[value["index"]].append({"expression": value["expression"], "output": value["output"]})
            elif what == "error":
                raise worker_error(value)
            else:
                break
        texts = ["".join(t) for t in texts]
        logprobs = [None] * job.n
        if job.top_logprobs is not None:
            logprobs = [api.chat_logprobs(e) if chat else api.completion_logprobs(e) for e in entries]
        make = api.chat_reply if chat else api.completion_reply
        extras = {**extras, "tool_calls": calls} if any(calls) else extras
        return JSONResponse(make(rid, name, texts, start, value, extras, logprobs))

    async def on_api_error(request, e):
        return api_error_response(e)

    async def on_http_error(request, e):
        message = {404: f"no such endpoint: {request.method} {request.url.path}",
                   405: f"{request.method} is not allowed on {request.url.path}"}.get(e.status_code, str(e.detail))
        return error_response(e.status_code, message)

    async def on_client_disconnect(request, e):
        return JSONResponse({}, status_code=499)

    async def on_error(request, e):  # a bug: the client gets one line, the log the traceback
        traceback.print_exception(e, file=sys.stderr)
        return error_response(500, f"internal error: {type(e).__name__}", "server_error")

    routes = [
        Route("/", page, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
    ]
    handlers = {ApiError: on_api_error, HTTPException: on_http_error, ClientDisconnect: on_client_disconnect,
                Exception: on_error}
    guard = Middleware(HostGuard, names=state.host_names,
                       refuse=lambda message: error_response(400, message, code="invalid_host"))
    return Starlette(routes=routes, exception_handlers=handlers, middleware=[guard])


def run_server(app, state, sock, on_ready=None):
    """Serve until SIGINT or SIGTERM: open streams are cut (their clients get an error
    event and [DONE]), waiting requests refused, and the call returns (exit 0)."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            # uvicorn's own handler records the signal and raises it again once stopped,
            # which would end the process by that signal: a stop asked for is a clean exit here.
            # This runs between any two bytecodes of the main thread, perhaps while the event
            # loop holds the worker's lock (admitting a request, counting for /health): the
            # worker is stopped by the loop, at once after, not here, where it would deadlock.
            try:
                asyncio.get_running_loop().call_soon_threadsafe(state.worker.stop)
            except RuntimeError:
                pass  # no loop running (yet, or any more): serve() stops the worker when this returns
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
            self.should_exit = True

        async def startup(self, sockets=None):
            asyncio.get_running_loop().set_exception_handler(QuietAcceptErrors())
            await super().startup(sockets)
            if on_ready is not None and self.started:
                on_ready(self)

    full = refusal(api.error_body("the server has no room for another connection (its open-files limit, "
                                  "ulimit -n): try again in a moment", "server_error", None, "too_many_connections"))
    protocol = timed_protocol(state.cfg.request_timeout, connection_limit(), full)  # gptkit/serve/guard.py
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=5,
                            lifespan="off", h11_max_incomplete_event_size=64 * 1024, http=protocol,
                            timeout_keep_alive=KEEP_ALIVE_S, backlog=LISTEN_BACKLOG,
                            proxy_headers=False)  # nothing reads X-Forwarded-*: one middleware less per request
    server = Server(config)
    server.run(sockets=[sock])
    return server
