"""The one generation worker of serve.py: a thread that owns the model and answers
requests one at a time, in the order they came.

Requests are queued, not batched. Batching pays in throughput (measured, one CPU
thread: 16 equal prompts as one batch gave the chat_arithmetic shape ~18x one stream's
tokens/s and GPT-2 124M's ~2.8x; `python bench.py serve` has the rows), but prompts
of different lengths in one batch need left padding, a padding mask and per-row
positions in model.py's KV cache, which it does not have; a second decoding loop
here would break the one-model rule. Queued, every reply is exactly sample.py's:
the same call (gptkit/chat_session.py's `reply`, gptkit/generate.py's
`generate_samples`) on a batch of one.

At most `capacity` requests are admitted at once (the one generating and those
waiting); one more is refused at once (`Overloaded`). Each job's text comes back
through `emit(kind, value)`, called from this thread; a cancelled job (its client
left, the server is stopping) stops at its next token and frees its place at once.
"""

import dataclasses
import queue
import sys
import threading
import time
import traceback

from gptkit import chat_session, faults
from gptkit.chat import chat_vocabulary, prompt_ids
from gptkit.errors import UserError, first_line
from gptkit.generate import end_of_text, generate_samples


class Overloaded(Exception):
    """Every place is taken: the client should try again later."""


class Cancelled(Exception):
    """The job's client left (or the server is stopping): stop generating."""


@dataclasses.dataclass(eq=False)  # compared and hashed as itself: the worker keeps a set of them
class Job:
    """One request: a chat (`messages`) or a plain continuation (`prompt_ids`), its
    sampling settings (a dataclass with generate_samples's fields) and where its
    events go. Events: ("start", {prompt_tokens, dropped_messages}) once the prompt
    is read and the first token made, ("text", piece)..., then ("done", {completion_tokens,
    finish_reason}) or ("error", (status, message, code))."""

    settings: object
    emit: object
    messages: list | None = None
    prompt: list | None = None
    cancelled: threading.Event = dataclasses.field(default_factory=threading.Event)

    def cancel(self):
        self.cancelled.set()


class Worker:
    def __init__(self, model, tokenizer, device, decoder, capacity):
        self.model, self.tokenizer, self.device, self.decoder = model, tokenizer, device, decoder
        self.capacity = capacity
        self.jobs = queue.Queue()
        self.lock = threading.Lock()
        self.admitted = set()  # jobs waiting or running
        self.stopping = False
        # A plain continuation ends at the end of text, and on a chat model at any turn token too
        # (they are ids past the tokenizer's vocabulary: no text to decode them to).
        turns = chat_vocabulary(model.config.vocab_size, tokenizer.vocab_size) or {}
        self.delay = faults.token_delay()  # test-only: 0 unless GPT_FAULTS=token_delay=S
        self.plain_stops = end_of_text(tokenizer) + sorted(turns.values())
        self.thread = threading.Thread(target=self._loop, name="generation", daemon=True)

    def start(self):
        self.thread.start()

    def submit(self, job):
        with self.lock:
            if self.stopping:
                raise Overloaded("the server is shutting down")
            if len(self.admitted) >= self.capacity:
                raise Overloaded(f"the server is busy: {self.capacity} requests are already queued or running; "
                                 "try again in a moment")
            self.admitted.add(job)
        self.jobs.put(job)

    def busy(self):
        with self.lock:
            return len(self.admitted)

    def stop(self):
        """Cut the running job, refuse the waiting ones and end the thread."""
        with self.lock:
            self.stopping = True
            jobs = list(self.admitted)
        for job in jobs:
            job.cancel()
        self.jobs.put(None)

    def join(self, timeout=None):
        self.thread.join(timeout)

    def _loop(self):
        while True:
            job = self.jobs.get()
            if job is None:
                return
            try:
                if job.cancelled.is_set():
                    job.emit("error", (503, "the request was cancelled before it ran", "cancelled"))
                else:
                    self._run(job)
            except Cancelled:
                job.emit("error", (503, "generation was cut: the server is shutting down or the client left",
                                   "cancelled"))
            except UserError as e:
                job.emit("error", (400, str(e), "invalid_request"))
            except Exception as e:  # a bug or an out-of-memory: this request fails, the server goes on
                traceback.print_exc(file=sys.stderr)
                job.emit("error", (500, f"generation failed: {first_line(e)}", "server_error"))
            finally:
                with self.lock:
                    self.admitted.discard(job)

    def _run(self, job):
        started = {}
        info = {}

        def on_text(piece):  # called once for every token, and once at the end
            if self.delay:
                time.sleep(self.delay)
            if job.cancelled.is_set():
                raise Cancelled()
            if not started:
                started.update(start_info())
                job.emit("start", dict(started))
            if piece:
                job.emit("text", piece)

        if job.messages is not None:
            session, last, kept = self._session(job.messages)

            def start_info():  # reply() has joined the user's text and dropped the oldest turns by now
                history = session.messages()
                ids = prompt_ids(history, self.tokenizer.encode, self.tokenizer.vocab_size)
                return {"prompt_tokens": len(ids), "dropped_messages": kept + 1 - len(session.history)}

            chat_session.reply(session, last, job.settings, self.device, on_text=on_text, decoder=self.decoder,
                               info=info)
        else:
            def start_info():
                return {"prompt_tokens": len(job.prompt), "dropped_messages": 0}

            generate_samples(self.model, self.tokenizer, job.prompt, job.settings, self.device, on_text=on_text,
                             stop_tokens=self.plain_stops, decoder=self.decoder, info=info)
        if not started:  # max_tokens 0, or nothing to say
            started.update(start_info())
            job.emit("start", dict(started))
        finish = "stop" if info.get("stopped") else "length"
        job.emit("done", {"completion_tokens": info.get("new_tokens", 0), "finish_reason": finish})

    def _session(self, messages):
        """A chat_session.Session holding the conversation before its last (user) message."""
        system = messages[0]["content"] if messages[0]["role"] == "system" else None
        history = [dict(m) for m in messages[1 if system is not None else 0 : -1]]
        session = chat_session.Session(self.model, self.tokenizer, system or None, history)
        return session, messages[-1]["content"], len(history)
