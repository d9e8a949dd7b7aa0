"""Continuous batching: serve.py's requests generate together, one token each per step,
joining the running batch at the next step and leaving it when done.

Every request's reply (every choice of it: n rows) is one `Row`. The rows share one
model.py BatchKVCache, row i of the cache holding row i's keys and values at their own
positions (model.py documents the shapes and the padding mask). One `Batch.step`:

    1. rows whose client left are dropped (cache.keep): their place frees at once
    2. the running rows' last tokens, (B, 1), run through model.next_token_logits with
       the batch cache: one forward for all of them, each row at its own position
    3. new rows' prompts run apart from the batch (those of one length together, in a
       BatchKVCache of their own) and their cache rows are appended: they are in the
       batch from the next step
    4. every row picks its next token from its own logits with its own settings and
       random generator (gptkit/generation/sampling.py's choose_next_token, as sample.py does),
       and its text grows through generate.py's TextStream (stop strings, stop tokens);
       a row that runs tools and has just closed a call gets the calculator's output as
       tokens (gptkit/generation/tools.py's run_call), and runs again apart from the
       batch at the next step, from its tokens so far, as a new row does

A row's tokens are those generate.generate_samples gives the same request alone
(shift_context past block_size, as a one-request server ran it; chat_session.tool_reply's
when it calls a tool, which also starts again from the reply so far): the same prompt,
the same per-row choices, the same seeded generator, and logits from model.py's
forward that differ from the one-row forward's only in float rounding. So at
temperature 0 (and with a seed) a reply is the same alone or batched.
"""

import dataclasses

import torch

from gptkit.ops.errors import first_line
from gptkit.generation.generate import TextStream, same_logits_tolerance
from gptkit.generation.sampling import choose_next_token
from gptkit.generation.tools import run_call
from model import BatchKVCache, KVCache


@dataclasses.dataclass(eq=False)
class Row:
    """One reply being written: its tokens so far, its settings and its text."""

    tokens: list  # the prompt's ids, then each new token
    settings: object  # api.Sampling: max_new_tokens, temperature, top_k, top_p, min_p, ...
    stream: TextStream
    generator: torch.Generator
    on_token: object  # on_token(row, token, logprobs): called after each new token
    top_logprobs: int | None = None  # None: no logprobs; k: the chosen token's and the k best
    new_tokens: int = 0  # tokens generated, a stop token included
    context: list | None = None  # tokens to run alone before the next step (a new or shifted row)
    finished: bool = False
    error: Exception | None = None  # what made this row fail, if anything did
    tools: dict | None = None  # a chat model's special ids when its calls run the calculator, else None
    calls: list = dataclasses.field(default_factory=list)  # the calls run: {"expression", "output", "ids"}
    call: dict | None = None  # the call run at this row's latest token, if any (for on_token)
    reply_start: int = 0  # where the reply begins in tokens (set by Batch.add)

    @property
    def stopped(self):
        return self.stream.stopped


def logprobs_of(logits, token, k):
    """(the chosen token's log-probability, [(id, log-probability)] of the k most likely):
    the model's own distribution, log_softmax of its logits, before temperature or filters."""
    logp = torch.log_softmax(logits.float(), dim=-1)  # (V,)
    best = torch.topk(logp, min(k, logp.numel())) if k else None
    top = list(zip(best.indices.tolist(), best.values.tolist())) if best is not None else []
    return float(logp[token]), top


class Batch:
    """The running rows and their shared cache; step() advances every row by one token."""

    def __init__(self, model, device):
        self.model, self.device = model, device
        self.block = model.config.block_size
        self.rows = []  # in the cache's row order
        self.cache = BatchKVCache(model.config.n_layer, self.block, 0, device)
        self.waiting = []  # rows whose context runs at the next step, before they join

    def __len__(self):
        return len(self.rows) + len(self.waiting)

    def add(self, row):
        """A new row: its prompt (cropped to the last block_size tokens) runs at the next step."""
        row.context = row.tokens[-self.block:]
        row.reply_start = len(row.tokens)
        if row.settings.max_new_tokens == 0:
            row.finished = True
        else:
            self.waiting.append(row)

    def drop(self, leaving):
        """Take the rows in `leaving` out of the batch (done, failed or their client left)."""
        if not leaving:
            return
        keep = [i for i, r in enumerate(self.rows) if r not in leaving]
        if len(keep) < len(self.rows):
            self.cache.keep(keep)
            self.rows = [self.rows[i] for i in keep]
        self.waiting = [r for r in self.waiting if r not in leaving]

    @torch.inference_mode()
    def step(self):
        """One new token for every row; returns the rows that finished in this step. Three
        phases, as nano-vllm's LLMEngine.step: which rows run how, the model, each row's token."""
        self.schedule()
        logits = self.forward()
        return self.advance(logits)

    def schedule(self):
        """A row whose cache is full (block_size positions) starts again from its last
        block_size // 2 tokens (generate_stream's shift_context), and a row given a tool's
        output (its context set by _run_call) from its tokens so far: they run as a new row does."""
        full = [r for r, n in zip(self.rows, self.cache.length[:, 0].tolist()) if n >= self.block]
        for row in full:
            row.context = row.tokens[-max(1, self.block // 2):]
        again = [r for r in self.rows if r.context is not None]
        self.drop(set(again))
        self.waiting += again

    def forward(self):
        """The next token's logits, one (vocab_size,) tensor per row in self.rows' order after
        the waiting rows have joined: the running rows read one token each, at each row's own
        position; new (or shifted) rows run their prompts without the others, those of one
        length together (no padding needed), then their cache rows join the batch."""
        logits = []
        if self.rows:
            last = torch.tensor([[r.tokens[-1]] for r in self.rows], device=self.device)  # (B, 1)
            logits = list(self.model.next_token_logits(last, self.cache))  # B x (vocab_size,)
        by_length = {}
        for row in self.waiting:
            by_length.setdefault(len(row.context), []).append(row)
        for group in by_length.values():
            fresh = BatchKVCache(self.model.config.n_layer, self.block, len(group), self.device)
            ids = torch.tensor([row.context for row in group], device=self.device)  # (G, T)
            logits += list(self.model.next_token_logits(ids, fresh))
            self.cache.append(fresh)
            self.rows += group
            for row in group:
                row.context = None
        self.waiting = []
        return logits

    def advance(self, logits):
        """Each row's token, text and end; the rows that finished leave the batch and are returned.
        Greedy rows without a penalty take the argmax: for all of them in one call."""
        greedy = [i for i, r in enumerate(self.rows)
                  if r.settings.temperature == 0 and r.settings.repetition_penalty == 1.0]
        picked = {}
        if greedy:
            best = torch.stack([logits[i] for i in greedy]).float().argmax(dim=-1)  # (G,)
            picked = dict(zip(greedy, best.tolist()))
        done = set()
        for i, (row, row_logits) in enumerate(zip(self.rows, logits)):
            try:
                self._advance(row, row_logits, picked.get(i))
            except Exception as e:  # this row's bug or bad value: it fails alone, the others go on
                row.error = e
                done.add(row)
                continue
            if row.finished:
                done.add(row)
        self.drop(done)
        return done

    def _advance(self, row, logits, token=None):
        """Row's next token (`token` when already picked), its text and whether it is done."""
        s = row.settings
        if token is None:
            previous = torch.tensor([row.tokens], device=self.device)  # (1, T): the penalty's tokens
            token = int(choose_next_token(logits[None], s.temperature, s.top_k, s.top_p, s.min_p,
                                          s.repetition_penalty, previous_tokens=previous,
                                          generator=row.generator)[0])
        row.tokens.append(token)
        row.new_tokens += not row.stream.stopped
        row.stream.push(token)
        row.call = None
        if row.tools is not None and token == row.tools["<|/call|>"] and not row.stream.stopped:
            self._run_call(row)
        logprobs = None
        if row.top_logprobs is not None:
            logprobs = logprobs_of(logits, token, row.top_logprobs)
        if row.stream.stopped or row.new_tokens >= s.max_new_tokens:
            row.finished = True
            row.stream.close()
        row.on_token(row, token, logprobs)

    def _run_call(self, row):
        """The call the row just closed, run: its output's tokens join the row (and its text),
        and the row runs them apart at the next step (the cache has not seen them)."""
        row.call = run_call(row.tokens[row.reply_start:], row.stream.tokenizer, row.tools)
        row.calls.append(row.call)
        row.tokens += row.call["ids"]
        for forced in row.call["ids"]:
            row.stream.push(forced)
        row.context = row.tokens[-self.block:]


@torch.inference_mode()
def batching_differs(model, device, rows=3, steps=2):
    """Why model.py's forward cannot run `rows` replies of different lengths together as
    Batch does, or None. A learner's edit may hold for one row and not for several: a
    position read as one number (int(start)), attention that ignores the mask hiding
    another row's longer history. Prompts of 2, 3, ... tokens run apart, then `steps`
    tokens together through one BatchKVCache; each row's logits must equal those of the
    same row alone through a KVCache (float rounding aside)."""
    block, vocab = model.config.block_size, model.config.vocab_size
    lengths = [min(2 + i, block - steps) for i in range(rows)]
    if min(lengths) < 1:
        return None  # too short a context to tell
    prompts = [torch.arange(1, n + 1, device=device)[None, :] % vocab for n in lengths]  # (1, n) each
    following = torch.arange(steps, device=device) % vocab  # the tokens every row takes next
    try:
        batch = BatchKVCache(model.config.n_layer, block, 0, device)
        together = [[] for _ in prompts]
        for i, prompt in enumerate(prompts):
            fresh = BatchKVCache(model.config.n_layer, block, 1, device)
            together[i].append(model.next_token_logits(prompt, fresh)[0])
            batch.append(fresh)
        for token in following:
            logits = model.next_token_logits(token.repeat(len(prompts), 1), batch)  # (rows, vocab)
            for i in range(len(prompts)):
                together[i].append(logits[i])
    except Exception as e:
        return f"{type(e).__name__}: {first_line(e)}"
    tolerance = same_logits_tolerance(model)
    for i, prompt in enumerate(prompts):
        cache = KVCache(model.config.n_layer, block)
        alone = [model.next_token_logits(prompt, cache)[0]]
        alone += [model.next_token_logits(token.view(1, 1), cache)[0] for token in following]
        for a, b in zip(alone, together[i]):
            gap = (a.float() - b.float()).abs().max().item() / max(1.0, a.abs().max().item())
            if not gap <= tolerance:  # NaN fails too
                return f"a row of {lengths[i]} tokens beside others gets logits {gap:.2g} away from its own alone"
    return None
