"""The one generation worker of serve.py: a thread that owns the model and runs every
admitted request in one continuous batch (gptkit/serve/batch.py).

A request (a `Job`) waits in a queue until the batch has room for its rows (n of
them, one per choice; at most `max_batch` rows run at once), then joins it at the
next step and leaves when its last row is done. At most `capacity` requests are
admitted at once (running and waiting); one more is refused at once (`Overloaded`).
A request's place is given back before its last event is sent, so a client that
sends its next request on reading the reply always finds it free.

A job whose client leaves (`Job.cancel`, called by the HTTP side the moment the
connection closes) frees its place at once when it is waiting, and its rows leave
the batch before the next step when it is running: within one token's time.

Each job's events come back through `emit(kind, value)`, called from this thread:
    ("start", {prompt_tokens, dropped_messages})       once, before its first token
    ("text", {index, text, logprobs})                   new text of choice `index`
    ("tool", {index, expression, output})               choice `index` called the calculator (its
                                                         output's markers and text follow as "text")
    ("done", {choices: [{finish_reason, completion_tokens}], completion_tokens})
    ("error", (status, message, code))                  instead of done
"""

import collections
import contextlib
import dataclasses
import sys
import threading
import time
import traceback

import torch

from gptkit.generation import chat_session

from gptkit.ops import faults
from gptkit.data.chat import chat_vocabulary, marked_reply_messages
from gptkit.ops.errors import UserError, first_line
from gptkit.generation.generate import TextStream, end_of_text, turn_marker
from gptkit.serve.batch import Batch, Row


class Overloaded(Exception):
    """Every place is taken: the client should try again later."""


@dataclasses.dataclass(eq=False)  # compared and hashed as itself: the worker keeps sets of them
class Job:
    """One request: a chat (`messages`) or a plain continuation (`prompt`), its sampling
    settings (api.Sampling), `n` choices, `top_logprobs` (None: no log-probabilities;
    k: the chosen token's and the k most likely) and where its events go."""

    settings: object
    emit: object
    messages: list | None = None
    prompt: list | None = None
    n: int = 1
    top_logprobs: int | None = None
    cancelled: threading.Event = dataclasses.field(default_factory=threading.Event)
    on_cancel: object = None  # set by Worker.submit
    rows: list = dataclasses.field(default_factory=list)
    ended: bool = False  # its place is freed and its last event sent: nothing left to stop

    def cancel(self):
        """The client left, or the server is stopping: stop generating and free the place now.
        A job that has ended is left alone (every reply's end calls this too: the worker
        is not woken for it)."""
        if not self.ended and not self.cancelled.is_set():
            self.cancelled.set()
            if self.on_cancel is not None:
                self.on_cancel(self)


CANCELLED = (503, "generation was cut: the server is shutting down or the client left", "cancelled")


class TokenEntries:
    """A row's log-probability entries, handed out with the text they made, so that the
    tokens of a reply spell its text: an entry goes out once its text has (a tail held
    back as the possible start of a stop string holds its tokens back too); where a stop
    string cuts the reply, the tokens past the cut are dropped, and a token the cut falls
    inside keeps the part of its text before the cut."""

    def __init__(self):
        self.waiting = collections.deque()  # (start, end, token text, logprob, top): not handed out yet
        self.end = 0  # where the last token's text ends in the reply's text

    def add(self, text_length, token, logprob, top):
        """A token whose push made the reply's text `text_length` characters long."""
        start, self.end = self.end, max(self.end, text_length)
        self.waiting.append((start, self.end, token, logprob, top))

    def take(self, shown, final=None):
        """The entries whose text is within the first `shown` characters; all that are
        left when `final` (the reply's whole text, cut at its stop string) is given."""
        ready = []
        # (start < shown: a token that added no text yet, half a character, waits for the rest)
        while self.waiting and (final is not None or self.waiting[0][0] < shown and self.waiting[0][1] <= shown):
            start, end, token, logprob, top = self.waiting.popleft()
            if final is not None and start >= len(final):
                continue  # all its text is past the cut: the stop string's own tokens
            if final is not None and start + len(token) > len(final):
                token = final[start:]  # the cut falls inside it
            ready.append((token, logprob, top))
        return ready


class Worker:
    def __init__(self, model, tokenizer, device, capacity, max_batch=16, around_step=contextlib.nullcontext,
                 tools="calculator"):
        self.model, self.tokenizer, self.device, self.tools = model, tokenizer, device, tools
        self.capacity, self.max_batch = capacity, max_batch
        self.cond = threading.Condition()
        self.queue = collections.deque()  # jobs waiting for room in the batch
        self.admitted = set()  # jobs waiting or running: what capacity counts
        self.running = set()
        self.stopping = False
        self.batch = Batch(model, device)
        # A plain continuation ends at the end of text, and on a chat model at any turn token too
        # (they are ids past the tokenizer's vocabulary: no text to decode them to).
        turns = chat_vocabulary(model.config.vocab_size, tokenizer.vocab_size) or {}
        self.delay = faults.token_delay()  # test-only: 0 unless GPT_FAULTS=token_delay=S
        self.plain_stops = end_of_text(tokenizer) + sorted(turns.values())
        self.thread = threading.Thread(target=self._loop, name="generation", daemon=True)
        # Around each step: serve.py passes its Mailboxes.step, so that a step's events go to
        # the HTTP side together, after it (gptkit/serve/app.py says why).
        self.around_step = around_step

    def start(self):
        self.thread.start()

    def submit(self, job):
        with self.cond:
            if self.stopping:
                raise Overloaded("the server is shutting down")
            if len(self.admitted) >= self.capacity:
                raise Overloaded(f"the server is busy: {self.capacity} requests are already queued or running; "
                                 "try again in a moment")
            job.on_cancel = self._cancelled
            self.admitted.add(job)
            self.queue.append(job)
            self.cond.notify()

    def busy(self):
        with self.cond:
            return len(self.admitted)

    def stop(self):
        """Cut the running jobs, refuse the waiting ones and end the thread."""
        with self.cond:
            self.stopping = True
            jobs = list(self.admitted)
        for job in jobs:
            job.cancel()
        with self.cond:
            self.cond.notify()

    def join(self, timeout=None):
        self.thread.join(timeout)

    def _cancelled(self, job):  # from the HTTP side's thread: a waiting job leaves at once
        with self.cond:
            if job in self.queue:
                self.queue.remove(job)
                self.admitted.discard(job)
                job.emit("error", CANCELLED)
            self.cond.notify()

    def _finish(self, job, kind, value):
        """The job's last event, after its place is freed."""
        with self.cond:
            self.admitted.discard(job)
            self.running.discard(job)
        self.batch.drop(set(job.rows))
        job.ended = True
        job.emit(kind, value)

    def _loop(self):
        while True:
            with self.cond:
                while not (self.stopping or self.queue or self.running):
                    self.cond.wait()
                if self.stopping:
                    break
                starting = []
                rows = len(self.batch)
                while self.queue and rows + self.queue[0].n <= self.max_batch:
                    starting.append(self.queue.popleft())
                    rows += starting[-1].n
            for job in starting:
                self._guarded(job, self._start)
            for job in [j for j in self.running if j.cancelled.is_set()]:
                self._finish(job, "error", CANCELLED)
            if len(self.batch):
                with self.around_step():
                    self._step()
                if self.delay:
                    time.sleep(self.delay)
        for job in list(self.running) + list(self.queue):
            self._finish(job, "error", CANCELLED)

    def _step(self):
        """One new token for every row; the jobs whose rows are all done end."""
        try:
            finished = self.batch.step()
        except Exception as e:  # the batch's forward failed (a bug, out of memory): every job ends
            traceback.print_exc(file=sys.stderr)
            for job in list(self.running):
                self._finish(job, "error", (500, f"generation failed: {first_line(e)}", "server_error"))
            return
        for row in finished:
            self._row_done(row)

    def _guarded(self, job, action, *args):
        """action(job, *args); a mistake in the request or a bug ends this job alone."""
        try:
            action(job, *args)
        except UserError as e:
            self._finish(job, "error", (400, str(e), "invalid_request"))
        except Exception as e:  # a bug or an out-of-memory: this request fails, the server goes on
            traceback.print_exc(file=sys.stderr)
            self._finish(job, "error", (500, f"generation failed: {first_line(e)}", "server_error"))

    def _start(self, job):
        """The job's prompt and its rows, which join the batch at the next step."""
        if job.messages is not None:
            session, text, sent = self._session(job.messages)
            ids, stops = chat_session.reply_prompt(session, text, job.settings.max_new_tokens)
            kept = len(session.history) - 1  # the history's messages left after dropping, the new one aside
            dropped = sent[len(sent) - kept] if kept else len(set(sent))  # the request's messages left out
            tools = session.ids if session.has_tool_tokens and self.tools != "none" else None
        else:
            ids, stops, dropped, tools = job.prompt, self.plain_stops, 0, None
        with self.cond:
            self.running.add(job)
        job.emit("start", {"prompt_tokens": len(ids), "dropped_messages": dropped})
        for index in range(job.n):
            generator = torch.Generator(device=self.device)
            generator.manual_seed(job.settings.seed + index)  # choice i: the reply seed + i gives alone
            row = Row(list(ids), job.settings, TextStream(self.tokenizer, job.settings.stop, stops), generator,
                      self._on_token(job, index), job.top_logprobs, tools=tools)
            job.rows.append(row)
            self.batch.add(row)
        if all(row.finished for row in job.rows):  # max_tokens 0: nothing to generate
            self._row_done(job.rows[0])

    def _on_token(self, job, index):
        waiting = TokenEntries()

        def on_token(row, token, logprobs):
            text, entries = row.stream.take_new(), None
            if row.call is not None:  # before its text: the markers and output the call forced in
                call = row.call
                job.emit("tool", {"index": index, "expression": call["expression"], "output": call["output"]})
            if logprobs is not None:
                if token not in row.stream.stop_tokens:
                    logprob, top = logprobs
                    waiting.add(len(row.stream.text), self._text(token), logprob,
                                [(self._text(t), p) for t, p in top])
                entries = waiting.take(row.stream.shown, row.stream.text if row.finished else None)
            if text or entries:
                job.emit("text", {"index": index, "text": text, "logprobs": entries})
        return on_token

    def _text(self, token):
        """A token's own text, for log-probabilities: a turn token as its marker."""
        if token >= self.tokenizer.vocab_size:
            return turn_marker(token, self.tokenizer.vocab_size)
        return self.tokenizer.decode([token])

    def _row_done(self, row):
        job = next((j for j in self.running if row in j.rows), None)
        if job is None:  # the job has ended already (another of its rows failed)
            return
        if row.error is not None:
            e = row.error
            if not isinstance(e, UserError):
                traceback.print_exception(e, file=sys.stderr)
            status = 400 if isinstance(e, UserError) else 500
            self._finish(job, "error", (status, f"generation failed: {first_line(e)}", "server_error"))
            return
        if all(r.finished for r in job.rows):
            choices = [{"finish_reason": "stop" if r.stopped else "length", "completion_tokens": r.new_tokens}
                       for r in job.rows]
            self._finish(job, "done", {"choices": choices,
                                       "completion_tokens": sum(c["completion_tokens"] for c in choices)})

    def _session(self, messages):
        """A chat_session.Session holding the conversation before its last (user) message, that
        message, and for each message of the session's history the index of the request's
        message it came from (an earlier reply with tool calls sent back as its markers' text
        is several messages again, as the tokens it was)."""
        system = messages[0]["content"] if messages[0]["role"] == "system" else None
        history = [dict(m) for m in messages[1 if system is not None else 0 : -1]]
        session = chat_session.Session(self.model, self.tokenizer, system or None, history)
        sent = list(range(len(history)))
        if session.has_tool_tokens:
            expanded = [marked_reply_messages(m["content"], self.tokenizer.vocab_size) if m["role"] == "assistant"
                        else [m] for m in history]
            session.history = [r for parts in expanded for r in parts]
            sent = [i for i, parts in enumerate(expanded) for _ in parts]
        return session, messages[-1]["content"], sent
