"""Tokenizing prepare.py's text stream in parallel, in bounded memory.

The text is cut into tasks of about CHUNK_CHARS characters, a pool of worker
processes encodes them, and the results come back in input order with at most
a few tasks in flight, so memory does not grow with the corpus. A task is a
list of pieces (split, text, append_eot); its result is the token ids of its
train pieces and of its val pieces, as raw bytes ready to append to the bins
(and its character count, for progress).
"""

import multiprocessing
import signal
import threading
from collections import deque

import numpy as np

from gptkit.ops.errors import UserError

CHUNK_CHARS = 1 << 20  # ~1 MB of text per task: ~0.2 s of BPE, so pickling costs are noise
MAX_CODE_POINT = 0x10FFFF

_worker = {}  # this process's tokenizer state, set by init_worker


def dtype_for(vocab_size):
    """uint16 holds ids 0..65535; larger vocabularies need uint32 (numpy would silently wrap)."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def code_points(text):
    # utf-32 gives one 4-byte unit per character; surrogatepass keeps lone surrogates
    # (which JSON escapes can produce) instead of failing on them.
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")


def init_worker(kind, chars=None, dtype="uint16", eot_id=None, bpe_json=None):
    """Set up this process's tokenizer: 'gpt2', 'bpe' (from its tokenizer.json text),
    'char' (with its vocabulary) or 'charset'."""
    if multiprocessing.parent_process() is not None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _worker.clear()
    _worker.update(kind=kind, dtype=np.dtype(dtype), eot_id=eot_id)
    if kind == "gpt2":
        from gptkit.data.tokenizer import load_gpt2_encoding

        _worker["encoding"] = load_gpt2_encoding()
    elif kind == "bpe":
        from gptkit.data.tokenizer import BPETokenizer

        _worker["encoding"] = BPETokenizer.from_json(bpe_json).encoding
    elif kind == "char":
        cps = np.array([ord(c) for c in chars], dtype=np.int64)
        lut = np.zeros(int(cps.max()) + 1, dtype=_worker["dtype"])
        assert len(chars) <= np.iinfo(lut.dtype).max + 1, f"{len(chars)} characters do not fit {dtype}"
        lut[cps] = np.arange(len(chars))
        _worker["lut"] = lut


def init_pool_worker(*init_args):
    """init_worker for a pool process, which must not fail: multiprocessing would start
    a new worker for the failed one, again and again, each printing its traceback. The
    reason is kept instead, and the worker's first task raises it (one line, in the parent)."""
    try:
        init_worker(*init_args)
    except Exception as e:  # e.g. tokenizer files missing offline, or an import error
        _worker.clear()
        reason = str(e).strip().splitlines()[0] if str(e).strip() else ""
        _worker["error"] = reason if isinstance(e, UserError) else f"{type(e).__name__}: {reason}"


def _check_worker():
    if "error" in _worker:
        raise UserError(f"a tokenizer process could not start: {_worker['error']}")


def encode_text(text):
    """Token ids of one piece of text as a numpy array of the bins' dtype."""
    if _worker["kind"] == "char":
        return _worker["lut"][code_points(text)]
    ids = _worker["encoding"].encode_ordinary(text)
    return np.array(ids, dtype=_worker["dtype"])  # ids < vocab_size, which dtype_for sized the dtype to hold


def encode_task(task):
    """(train bytes, val bytes, characters done) for a list of (split, text, append_eot) pieces."""
    _check_worker()
    parts = {"train": [], "val": []}
    eot = np.array([_worker["eot_id"]], dtype=_worker["dtype"]) if _worker["eot_id"] is not None else None
    for split, text, append_eot in task:
        if text:
            parts[split].append(encode_text(text))
        if append_eot:
            parts[split].append(eot)
    train, val = (np.concatenate(parts[s]).tobytes() if parts[s] else b"" for s in ("train", "val"))
    return train, val, sum(len(text) for _, text, _ in task)


def charset_task(text):
    """The sorted distinct code points of `text`."""
    _check_worker()
    seen = np.zeros(MAX_CODE_POINT + 1, dtype=bool)
    seen[code_points(text)] = True
    return np.flatnonzero(seen)


# Where may GPT-2 text be cut so that encoding the pieces separately gives exactly
# the ids of encoding it whole? tiktoken first splits text into pre-tokens with
#     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
# (tiktoken_ext/openai_public.py) and BPE-merges inside each pre-token only (the
# BPE prepare.py trains uses the same pattern, so all of this holds for it too). A cut
# at p is safe when (a) some pre-token of the whole text starts at p and (b) the
# pre-tokens before p do not change when the text ends at p. The pattern has no
# look-behind, so matching from p sees the same text either way; its only
# look-ahead is (?!\S) after a whitespace run. If text[p-1] is not whitespace, the
# pre-token holding it is a letter/number/punctuation run or a contraction, none
# of which can take in a whitespace character except a single *leading* space:
# so when text[p] is whitespace, that pre-token ends at p (a), and it is not a
# whitespace run, so nothing before p looks past p (b). Hence: cut right before a
# " " or "\n" whose previous character is not whitespace. (Python's isspace()
# covers every character regex \s matches, so "not isspace" is the safe side.)
# Counter-example for the rule's guard: "a\n\nb" encodes "\n" "\n" "b" whole, but
# a piece ending "a\n\n" ends with the single pre-token "\n\n" (id 628).
# Fallback for text without spaces (e.g. Chinese): a cut between a letter and a
# punctuation or symbol character (Unicode category P* or S*, never \s, \p{L} or
# \p{N}) is safe by the same argument. tests/test_prepare.py checks all of this.
SEARCH_FALLBACK_CHARS = 1 << 16


def gpt2_cut(text, start):
    """The largest safe cut p with start <= p < len(text) (see above), or None."""
    import unicodedata

    start = max(start, 1)
    for sep in ("\n", " "):
        p = text.rfind(sep, start)
        while p >= start:
            if not text[p - 1].isspace():
                return p
            p = text.rfind(sep, start, p)
    for p in range(len(text) - 1, max(start, len(text) - SEARCH_FALLBACK_CHARS) - 1, -1):
        if unicodedata.category(text[p])[0] in "PS" and text[p - 1].isalpha():
            return p
    return None


def any_cut(text, start):
    """Character-level encoding is per character: any position is a safe cut."""
    return max(start, 1) if len(text) > 1 else None


def build_tasks(segments, find_cut, chunk_chars=CHUNK_CHARS):
    """Tasks of about `chunk_chars` characters from (split, pieces, append_eot) segments.

    A segment is encoded as if whole (one document, or one side of a single
    document's split): pieces are joined and re-cut only at safe cuts, and
    `append_eot` goes after its last piece. A text with no safe cut at all is
    held whole (tiktoken makes a single pre-token of such a run anyway).
    """
    task, task_chars = [], 0
    for split, pieces, append_eot in segments:
        buf, searched = "", 0
        for piece in pieces:
            buf = buf + piece if buf else piece
            while len(buf) >= chunk_chars:
                p = find_cut(buf, max(searched, len(buf) // 2))
                if p is None:
                    searched = len(buf)
                    break
                task.append((split, buf[:p], False))
                task_chars += p
                buf, searched = buf[p:], 0
                if task_chars >= chunk_chars:
                    yield task
                    task, task_chars = [], 0
        task.append((split, buf, append_eot))
        task_chars += len(buf)
        if task_chars >= chunk_chars:
            yield task
            task, task_chars = [], 0
    if task:
        yield task


def batched_text(pieces, chunk_chars=CHUNK_CHARS):
    """Join small pieces into strings of about chunk_chars (for work where cuts do not matter)."""
    batch, size = [], 0
    for piece in pieces:
        batch.append(piece)
        size += len(piece)
        if size >= chunk_chars:
            yield "".join(batch)
            batch, size = [], 0
    if batch:
        yield "".join(batch)


def make_pool(workers, init_args):
    """A pool of `workers` processes set up by init_worker, or None to work in this process.

    'spawn' starts clean interpreters: safe even when the caller (train.py) has
    torch and its threads loaded, where fork can deadlock.
    """
    if workers <= 1:
        init_worker(*init_args)
        return None
    return multiprocessing.get_context("spawn").Pool(workers, initializer=init_pool_worker, initargs=init_args)


POOL_STOP_S = 5.0  # how long stop_pool lets Pool.terminate() take


def stop_pool(pool):
    """End a pool's workers, within POOL_STOP_S seconds whatever happens: should
    Pool.terminate() hang (see ordered_map), the workers are killed and the pool's
    threads, which are daemons, end with this process. So Ctrl-C always ends prepare."""
    stopper = threading.Thread(target=lambda: (pool.terminate(), pool.join()), daemon=True)
    stopper.start()
    stopper.join(POOL_STOP_S)
    if stopper.is_alive():
        for worker in pool._pool:  # the pool's own worker processes (no public accessor)
            if worker.exitcode is None:
                worker.kill()


def ordered_map(pool, fn, items, workers):
    """fn over items, results in order, at most 2 * workers + 1 tasks in flight.

    (Pool.imap would read the whole input ahead into its queue: unbounded memory.)
    Tasks beyond the workers keep them busy, but leave the pool's task thread blocked
    writing a large task into the pipe; Pool.terminate() may then wait for that thread
    for ever (CPython stops draining the pipe before it joins the thread; seen here in
    3 of about 14 interrupted runs, one of them in CI), hence stop_pool's time limit.
    Allowing only `workers` tasks in flight avoids the race but cost 12% of prepare's
    speed (100 MB, GPT-2 BPE, 2 workers: 5.1–5.4 s against 4.5–4.8 s).
    """
    if pool is None:
        for item in items:
            yield fn(item)
        return
    pending = deque()
    for item in items:
        pending.append(pool.apply_async(fn, (item,)))
        if len(pending) > 2 * workers:
            yield pending.popleft().get()
    while pending:
        yield pending.popleft().get()
