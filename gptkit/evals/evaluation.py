"""What eval.py does: load each model, score it on a text, a prepared split or the tasks,
and put the results side by side (a markdown table, or JSON for scripts).

Each model reads the text through its own tokenizer; the scoring itself is
gptkit/evals/scoring.py (sliding windows, every token once) and gptkit/evals/report_card.py (the tasks).
Bits per byte makes models with different tokenizers comparable.
"""

import itertools
import json
import math
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from gptkit.data import dataset
from gptkit.evals import scoring
from gptkit.ops.checkpoint import write_text_atomic
from gptkit.ops.errors import UserError
from gptkit.models.loading import find_checkpoint, load_model, model_from_checkpoint, read_checkpoint
from gptkit.ops.paths import shown
from gptkit.prepare.encode import CHUNK_CHARS, any_cut, build_tasks, gpt2_cut
from gptkit.prepare.sources import iter_documents, resolve_inputs


@dataclass
class Candidate:
    """A model to evaluate, on the CPU until it is scored."""

    name: str
    model: torch.nn.Module
    tokenizer: object
    tokens_seen: int | None  # training tokens (iterations x tokens per iteration); None if unknown
    summary: str

    @property
    def block_size(self):
        return self.model.config.block_size

    @property
    def tokenizer_name(self):
        kind = self.tokenizer.to_dict().get("type", "?")
        return f"{kind} ({self.tokenizer.vocab_size:,})"


@dataclass
class Settings:
    """How to score: shared by every model of one eval.py run."""

    device: torch.device
    dtype: torch.dtype
    batch_size: int = 8
    stride: int | None = None  # None: each model's block_size (no overlap, as train.py's eval_iters=0)
    max_tokens: int | None = None
    progress: bool = True

    @property
    def autocast(self):
        if self.dtype == torch.float32:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)


@dataclass
class Result:
    name: str
    params: int
    tokenizer: str
    tokens_seen: int | None
    score: scoring.Score | None = None
    seconds: float | None = None
    exact_match: dict | None = None  # "single", "multi": (replies written exactly, replies)
    answers: dict | None = None  # eval.py --answers: tools, exact, questions, rate (gptkit/evals/answers.py)
    tasks: dict | None = None  # the report card (gptkit/evals/report_card.py): "tasks", "summary"
    notes: list = field(default_factory=list)

    def to_dict(self):
        out = {"name": self.name, "params": self.params, "tokenizer": self.tokenizer, "tokens_seen": self.tokens_seen}
        if self.score is not None:
            s = self.score
            out.update(loss=s.loss, ppl=s.ppl, bpb=s.bpb, tokens=s.tokens, bytes=s.bytes, seconds=self.seconds,
                       tokens_per_s=s.tokens / self.seconds if self.seconds else None)
        if self.exact_match is not None:
            out["exact_match"] = {kind: {"exact": exact, "replies": total, "rate": exact / total if total else None}
                                  for kind, (exact, total) in self.exact_match.items()}
        if self.answers is not None:
            out["answers"] = self.answers
        if self.tasks is not None:
            from gptkit.evals.report_card import card_json

            out["tasks"] = card_json(self.tasks)
        return out


def load_candidate(spec, init_from=False):
    """A Candidate from a checkpoint file or out_dir (best.pt, else ckpt.pt), or with
    init_from from a GPT-2 name or a Hugging Face folder."""
    if init_from:
        model, tokenizer, summary = load_model(init_from=spec)
        return Candidate(Path(spec).name or spec, model, tokenizer, None, summary)
    path = Path(spec)
    try:
        path.stat()
    except (FileNotFoundError, NotADirectoryError):
        raise UserError(f"{spec} does not exist: give a checkpoint file or a training out_dir")
    except OSError as e:  # a name too long for the system, a loop of symlinks
        raise UserError(f"cannot read {shown(path)}: {e.strerror}")
    file = find_checkpoint(path) if path.is_dir() else path
    ckpt = read_checkpoint(file)  # UserError for a missing, damaged or unsafe file
    model, tokenizer, summary = model_from_checkpoint(ckpt, file)
    return Candidate(path.name if path.is_dir() else str(path), model, tokenizer, tokens_seen(ckpt), summary)


def tokens_seen(ckpt):
    """Training tokens behind a checkpoint: iterations x batch_size x block_size x accumulation steps."""
    config, iters = ckpt.get("config"), ckpt.get("iter_num")
    if not isinstance(config, dict) or not isinstance(iters, int):
        return None
    try:
        return iters * int(config["batch_size"]) * int(config["block_size"]) * int(config["gradient_accumulation_steps"])
    except (KeyError, TypeError, ValueError):
        return None


class InputText:
    """--input's documents, read (and encoded) only as far as each model needs: with
    --max_tokens N the reading stops once the model has N tokens. Files are read again
    for each model; a stream (a pipe, process substitution, `-`) can be read only once,
    so what was read of it is kept for the next model."""

    def __init__(self, paths):
        self.sources = resolve_inputs(paths)  # a missing or unreadable file fails before any model loads
        self.kept = [] if any(s.stream for s in self.sources) else None
        self.fresh = None

    def pieces(self):
        """(document number, text piece) pairs, in input order."""
        if self.kept is None:
            yield from _numbered(iter_documents(self.sources))
            return
        yield from self.kept
        if self.fresh is None:
            self.fresh = _numbered(iter_documents(self.sources))
        for pair in self.fresh:
            self.kept.append(pair)
            yield pair


def _numbered(docs):
    for number, pieces in enumerate(docs):
        for piece in pieces:
            yield number, piece


def encode_texts(candidate, texts, max_tokens=None):
    """Each document's token ids with the model's tokenizer: a list of int64 arrays,
    cut to max_tokens in all.

    The text is encoded in chunks cut only where encoding the pieces apart gives the ids
    of encoding it whole (gptkit/prepare/encode.py proves where; any cut for characters),
    small ones when few tokens are wanted, so a huge file costs what its first tokens do."""
    find_cut = any_cut if candidate.tokenizer.to_dict().get("type") == "char" else gpt2_cut
    chunk = CHUNK_CHARS if max_tokens is None else min(CHUNK_CHARS, max(1 << 12, max_tokens))
    by_doc = itertools.groupby(texts.pieces(), key=lambda pair: pair[0])
    segments = ((number, (p[i : i + chunk] for _, p in pairs for i in range(0, len(p), chunk)), False)
                for number, pairs in by_doc)
    docs, total = [], 0
    for task in build_tasks(segments, find_cut, chunk):
        for number, text, _ in task:
            try:
                ids = np.asarray(candidate.tokenizer.encode(text), dtype=np.int64)
            except UserError as e:
                raise UserError(f"{candidate.name}: {e}")
            if max_tokens is not None:
                ids = ids[: max_tokens - total]
            while len(docs) <= number:
                docs.append([])
            docs[number].append(ids)
            total += len(ids)
            if max_tokens is not None and total >= max_tokens:
                return [np.concatenate(d) for d in docs]
    return [np.concatenate(d) for d in docs]


def progress_bar(total, settings, desc, unit):
    """tqdm with an ETA on a terminal; None otherwise."""
    if not settings.progress or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, leave=False)


def score_sequences(candidate, n_tokens, read, settings, what):
    """Score sequences of the given lengths (read(seq, start, n) gives tokens): a Score."""
    T = candidate.block_size
    stride = min(settings.stride or T, T)
    windows = scoring.plan_windows(n_tokens, T, stride)
    if len(windows) == 0:
        raise UserError(
            f"{what} is {sum(n_tokens)} token(s) long with {candidate.name}'s tokenizer: scoring needs at least 2 "
            "in one document (one of context, one to predict)"
        )
    byte_lengths = scoring.byte_lengths_tensor(candidate.tokenizer, settings.device)
    model = candidate.model
    bar = progress_bar(len(windows), settings, candidate.name, "window")

    def advance(done, _rounds):
        if bar is not None:
            bar.update(min(done * settings.batch_size, len(windows)) - bar.n)

    try:
        total = scoring.score_windows(lambda x, y: model(x, y), read, windows, block_size=T,
                                      batch_size=settings.batch_size, byte_lengths=byte_lengths,
                                      device=settings.device, autocast=settings.autocast, between_batches=advance)
    finally:
        if bar is not None:
            bar.close()
    return scoring.Score.from_tensor(total)


def score_texts(candidate, texts, settings, what="the input"):
    docs = encode_texts(candidate, texts, settings.max_tokens)
    return score_sequences(candidate, [len(d) for d in docs], lambda i, start, n: docs[i][start : start + n],
                           settings, what)


def score_split(candidate, data_dir, name, split, settings):
    """Every token of a prepared split (data_dir/name/split.bin), read from disk window by window."""
    meta = dataset.load_meta(data_dir, name)
    if meta["tokenizer"] != candidate.tokenizer.to_dict():
        raise UserError(
            f"{candidate.name} uses a {candidate.tokenizer_name} tokenizer but dataset {name} was prepared with "
            f"{meta['tokenizer'].get('type')} ({meta['vocab_size']:,}): score it with --input on the raw text instead"
        )
    if "chat" in meta:
        return score_chat_split(candidate, data_dir, name, split, meta, settings)
    tokens = dataset.TokenBin(dataset.dataset_dir(data_dir, name) / f"{split}.bin", meta["dtype"])
    try:
        n = tokens.n_tokens if settings.max_tokens is None else min(tokens.n_tokens, settings.max_tokens)
        return score_sequences(candidate, [n], lambda _, start, k: tokens.read_windows([start], k)[0], settings,
                               f"{name}/{split}.bin")
    finally:
        tokens.close()


def score_chat_split(candidate, data_dir, name, split, meta, settings):
    """A chat split's assistant tokens only, in the windows train.py packs (gptkit/data/chat_batches.py):
    its eval_iters=0 val loss, and bits per byte of the replies' text."""
    from gptkit.data.chat_batches import ChatBatches, chat_byte_lengths

    if candidate.model.config.vocab_size != meta["vocab_size"]:
        raise UserError(
            f"{candidate.name} has {candidate.model.config.vocab_size:,} token ids, but chat dataset {name} has "
            f"{meta['vocab_size']:,} with its turn tokens: fine-tune it on the chat data first (train.py --dataset {name})"
        )
    T = candidate.block_size
    batches = ChatBatches(data_dir, name, meta, T, settings.device)
    rows = list(range(batches.n_windows(split)))
    if settings.max_tokens is not None:
        rows = rows[: max(1, settings.max_tokens // (T + 1))]
    byte_lengths = chat_byte_lengths(scoring.byte_lengths_tensor(candidate.tokenizer, settings.device), meta["vocab_size"])
    total = scoring.accumulator(settings.device)
    with torch.no_grad():
        for i in range(0, len(rows), settings.batch_size):
            x, y = batches.get(split, rows[i : i + settings.batch_size])
            with settings.autocast:
                total += scoring.score_batch(candidate.model, x, y, byte_lengths).to(total.dtype)
    return scoring.Score.from_tensor(total)


SESSION_CONVERSATIONS = 8  # conversations asked one after another in each multi-turn session
MAX_SESSIONS = 16  # sessions scored (a reply at a time: ~110 later turns or more, seconds on a CPU)


def chat_exact_match(candidate, data_dir, name, split, settings):
    """{"single": (exact, total), "multi": (exact, total)}: the assistant turns of a chat
    split that the model writes exactly (content and <|end|>), greedily.

    single: each reply given its conversation's own text before it (the reference turns),
    from position 0. multi: as a user meets the model in sample.py --chat or the server:
    the split's conversations asked one after another, SESSION_CONVERSATIONS to a
    session, every reply generated from the session's own history (the model's earlier
    replies, not the references; the oldest turns dropped as sample.py --chat drops
    them); the turns after a session's first are counted, in the first MAX_SESSIONS
    sessions (generated one reply at a time: the whole of a large split would take minutes)."""
    from gptkit.data.chat_batches import conversations_of

    meta = dataset.load_meta(data_dir, name)
    if "chat" not in meta:
        raise UserError(f"--exact_match scores the replies of a chat dataset; {name} is plain text")
    if candidate.model.config.vocab_size != meta["vocab_size"] or meta["tokenizer"] != candidate.tokenizer.to_dict():
        raise UserError(f"{candidate.name} was not trained on chat dataset {name}'s vocabulary: fine-tune it there first")
    folder = dataset.dataset_dir(data_dir, name)
    ids = np.fromfile(folder / f"{split}.bin", dtype=meta["dtype"])
    mask = np.fromfile(folder / f"{split}_mask.bin", dtype=np.uint8)
    turns = meta["chat"]["turn_ids"]
    conversations = [conv for conv, _ in conversations_of(ids, mask)]
    return {"single": single_turn_exact(candidate.model, conversations, turns, settings),
            "multi": session_exact(candidate, conversations, turns, settings)}


def single_turn_exact(model, conversations, turns, settings):
    """(exact, total) of every reply given the reference conversation before it."""
    from gptkit.generation.generate import generate_stream

    replies = {}  # prompt length -> [(prompt, reference reply with its <|end|>)]
    for conv in conversations:
        for p, token in enumerate(conv):
            if token == turns["<|assistant|>"]:
                end = conv.index(turns["<|end|>"], p)
                replies.setdefault(p + 1, []).append((conv[: p + 1], conv[p + 1 : end + 1]))
    exact = total = 0
    stops = list(turns.values())
    for group in replies.values():  # prompts of one length go together, as one batch
        for i in range(0, len(group), settings.batch_size):
            chunk = group[i : i + settings.batch_size]
            idx = torch.tensor([prompt for prompt, _ in chunk], device=settings.device)
            longest = max(len(reference) for _, reference in chunk)
            with settings.autocast:
                steps = torch.stack(list(generate_stream(model, idx, longest, temperature=0, stop_tokens=stops)), 1)
            for (_, reference), row in zip(chunk, steps.tolist()):
                exact += row[: len(reference)] == reference
                total += 1
    return exact, total


def messages_of(conv, turns, tokenizer):
    """One conversation's ids as messages, each with its content's ids."""
    role_of = {turns[f"<|{role}|>"]: role for role in ("system", "user", "assistant")}
    messages, i = [], 0
    while i < len(conv):
        end = conv.index(turns["<|end|>"], i)
        content = conv[i + 1 : end]
        messages.append({"role": role_of[conv[i]], "content": tokenizer.decode(content), "ids": content})
        i = end + 1
    return messages


def session_exact(candidate, conversations, turns, settings):
    """(exact, total) of the later turns of multi-turn sessions (chat_exact_match's "multi")."""
    from gptkit.generation.chat_session import Session
    from gptkit.generation.generate import generate_stream

    model, tokenizer = candidate.model, candidate.tokenizer
    room = max(1, model.config.block_size // 2)  # sample.py --chat's room for a reply (its default)
    stops = list(turns.values())
    exact = total = 0
    for first in range(0, min(len(conversations), MAX_SESSIONS * SESSION_CONVERSATIONS), SESSION_CONVERSATIONS):
        group = [messages_of(c, turns, tokenizer) for c in conversations[first : first + SESSION_CONVERSATIONS]]
        system = next((m["content"] for m in group[0] if m["role"] == "system"), None)
        session = Session(model, tokenizer, system)
        replied = 0
        for messages in group:
            for m in messages:
                if m["role"] == "user":
                    session.history.append({"role": "user", "content": m["content"]})
                elif m["role"] == "assistant":
                    reference = m["ids"] + [turns["<|end|>"]]
                    try:
                        prompt = session.prompt(room)  # the oldest turns dropped to leave room
                    except UserError:
                        session.history = session.history[-1:]  # a turn longer than the context: alone
                        prompt = session.prompt(room)
                    idx = torch.tensor([prompt], device=settings.device)
                    with settings.autocast:
                        steps = [int(t) for t in generate_stream(model, idx, 2 * len(reference) + 8,
                                                                 temperature=0, stop_tokens=stops)]
                    if replied:
                        exact += steps[: len(reference)] == reference
                        total += 1
                    replied += 1
                    own = steps[: next((k for k, t in enumerate(steps) if t in stops), len(steps))]
                    session.history.append({"role": "assistant", "content": tokenizer.decode(own)})
    return exact, total


def exact_match_lines(result):
    """eval.py's report of chat_exact_match: single-turn, then multi-turn sessions."""
    def rate(exact, total):
        return f"{exact:,} of {total:,} ({exact / total:.1%})" if total else "none to score"

    single, multi = result.exact_match["single"], result.exact_match["multi"]
    return (f"exact match, {result.name}: single turn {rate(*single)} replies (each given its "
            f"conversation before it); multi-turn {rate(*multi)} later turns (up to {MAX_SESSIONS} "
            f"sessions of {SESSION_CONVERSATIONS} conversations, each reply after the model's own earlier ones)")


def evaluate_candidate(candidate, settings, texts=None, split=None, exact_match=False, tasks=None, task_rows=32):
    """Move the model to the device, score what was asked, and free it again: a Result.
    tasks: [(gptkit.evals.tasks.Task, items)] for the report card, task_rows sequences a pass."""
    result = Result(candidate.name, candidate.model.num_params(), candidate.tokenizer_name, candidate.tokens_seen)
    candidate.model.to(settings.device)
    try:
        if exact_match:
            result.exact_match = chat_exact_match(candidate, *split, settings)
        if texts is not None or split is not None:
            t0 = time.perf_counter()
            if texts is not None:
                result.score = score_texts(candidate, texts, settings)
            else:
                result.score = score_split(candidate, *split, settings)
            if settings.device.type == "cuda":
                torch.cuda.synchronize()
            result.seconds = time.perf_counter() - t0
        if tasks:
            from gptkit.evals.report_card import score_tasks

            result.tasks = score_tasks(candidate, tasks, settings, task_rows, progress_bar)
            for line in result.tasks["tasks"]:
                if line["skipped"]:
                    result.notes.append(f"{line['title']}: skipped {line['skipped']:,} of "
                                        f"{line['skipped'] + line['items']:,} items: {line['skipped_why']}")
    finally:
        candidate.model.to("cpu")
    return result


def _count(n):
    if n is None:
        return "n/a"
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)


def markdown_table(results):
    """One row per model: name, parameters, tokenizer, tokens seen, scored tokens and bytes,
    loss, perplexity, bits per byte."""
    has_score = any(r.score is not None for r in results)
    head = ["model", "params", "tokenizer", "tokens seen"]
    if has_score:
        head += ["tokens", "bytes", "loss (nats/token)", "ppl", "bpb"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in results:
        cells = [r.name, _count(r.params), r.tokenizer, _count(r.tokens_seen)]
        if has_score:
            s = r.score
            cells += [f"{s.tokens:,}", f"{s.bytes:,}", f"{s.loss:.4f}", f"{s.ppl:.2f}", f"{s.bpb:.4f}"] if s else ["-"] * 5
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _finite(value):
    """JSON has no NaN or Infinity: write them as null."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json(results, path, settings, source):
    """The table's content for scripts: to a file, or stdout for '-'."""
    doc = {
        "source": source,
        "device": str(settings.device),
        "dtype": str(settings.dtype).removeprefix("torch."),
        "stride": settings.stride,
        "max_tokens": settings.max_tokens,
        "models": [r.to_dict() for r in results],
    }
    text = json.dumps(_finite(doc), indent=2)
    if str(path) == "-":
        print(text)
        return
    write_text_atomic(path, text + "\n")  # claimed (claim_output) before the first model was scored
