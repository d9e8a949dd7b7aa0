"""Training data: the token bins that prepare.py writes, and which windows to read.

A dataset is the folder `data/<name>/` holding `train.bin`, `val.bin` (raw
little-endian token ids) and `meta.json` (dtype, vocabulary, tokenizer, token
counts, fingerprint). `load_meta` checks the folder before any training starts;
`TokenBin` reads windows with `os.pread` from a file descriptor kept open (a
memmap kept open grew memory by ~258 MB over a long run here, see docs/reliability.md);
`global_batch_offsets` is the batch sampler, a pure function of (seed, step):

    offsets = global_batch_offsets(seed=1337, step=10, n_tokens=1_000_000,
                                   block_size=256, global_batch=64 * 4)

Rank r at micro-step m of an iteration takes the contiguous chunk number
`r * local_accum + m` of those windows, so N ranks see exactly the windows that
one process with N times the gradient accumulation sees.
"""

import json
import os
from pathlib import Path

import numpy as np
import torch

from gptkit.evals import scoring
from gptkit.data.chat_batches import ChatBatches
from gptkit.ops.errors import UserError
from gptkit.data.tokenizer import check_description
from gptkit.ops.untrusted import inside, read_regular, regular_size

FORMAT_VERSION = 1
DTYPES = {"uint16": np.uint16, "uint32": np.uint32}
AUTO_PREPARED = ("shakespeare_char", "shakespeare", "arithmetic_chat", "multiply_tools", "multiply_plain")  # built by name
DOWNLOADED = ("openwebtext", "fineweb_edu", "gsm8k_chat", "no_robots", "smoltalk")  # never train.py on its own
MAX_META_BYTES = 64 << 20  # meta.json: a character vocabulary and the list of sources
FULL_SCAN_BYTES = 1 << 30  # bins up to 1 GiB are checked whole at start-up (~0.1 s per 100 MB)


def prepare_command(name):
    if name in AUTO_PREPARED or name in DOWNLOADED:
        return f"python prepare.py {name}"
    return f"python prepare.py --input FILE --tokenizer char|gpt2|bpe --name {name}"


def dataset_dir(data_dir, name):
    return Path(data_dir) / name


def fingerprint(data_dir, name):
    """The fingerprint meta.json records for the dataset (prepare.py's hash of its sources
    and tokenizer), or None where it has none or cannot be read yet (load_meta then names
    the problem, or ensure_dataset prepares a missing named dataset)."""
    folder = dataset_dir(data_dir, name)
    try:
        value = read_meta_file(folder, folder / "meta.json", "").get("fingerprint")
    except (UserError, OSError):
        return None
    return value if isinstance(value, str) else None


def ensure_dataset(data_dir, name):
    """Prepare a missing named dataset that prepare.py knows how to build.

    Returns True when it prepared one. Anything else missing is left for
    `load_meta`, whose error gives the exact command."""
    folder = dataset_dir(data_dir, name)
    if (folder / "meta.json").is_file() or name not in AUTO_PREPARED:
        return False
    from gptkit.prepare.named import prepare_named  # only needed in this rare case; keeps start-up light

    print(f"dataset {folder} is missing: preparing it now (python prepare.py {name})")
    prepare_named(name, out_dir=str(data_dir))
    return True


def load_meta(data_dir, name, block_size=None):
    """Read and check `data/<name>/meta.json` and the bins it describes.

    Raises UserError naming the file and the fix for anything a user can repair:
    a missing folder or file, a foreign format version, a vocabulary that does
    not fit the dtype, a bin whose size disagrees with meta.json, a split
    shorter than one block."""
    folder = dataset_dir(data_dir, name)
    meta_path = folder / "meta.json"
    if not os.path.lexists(meta_path):
        why = "does not exist" if not folder.exists() else "has no meta.json (an unfinished prepare?)"
        raise UserError(f"dataset folder {folder} {why}: run {prepare_command(name)}")
    meta = read_meta_file(folder, meta_path, f"run {prepare_command(name)} again")
    for key in ("format_version", "tokenizer", "vocab_size", "dtype", "num_tokens"):
        if key not in meta:
            raise UserError(f"{meta_path} lacks '{key}': run {prepare_command(name)} again")
    types_ok = (
        isinstance(meta["vocab_size"], int) and not isinstance(meta["vocab_size"], bool)
        and isinstance(meta["tokenizer"], dict) and isinstance(meta["dtype"], str)
        and isinstance(meta["num_tokens"], dict)
        and all(isinstance(meta["num_tokens"].get(s), int) and meta["num_tokens"][s] >= 0 for s in ("train", "val"))
    )
    if not types_ok:
        raise UserError(
            f"{meta_path} is malformed (vocab_size must be an integer, tokenizer an object, num_tokens "
            f"{{'train': N, 'val': N}}): run {prepare_command(name)} again"
        )
    if meta["format_version"] != FORMAT_VERSION:
        raise UserError(
            f"{meta_path} has format_version {meta['format_version']}, this code reads "
            f"{FORMAT_VERSION}: run {prepare_command(name)} again"
        )
    if meta["dtype"] not in DTYPES:
        raise UserError(f"{meta_path}: dtype {meta['dtype']!r} is not one of {list(DTYPES)}")
    limit = np.iinfo(DTYPES[meta["dtype"]]).max + 1
    if not 0 < meta["vocab_size"] <= limit:
        raise UserError(
            f"{meta_path}: vocab_size {meta['vocab_size']} does not fit dtype {meta['dtype']} "
            f"(at most {limit}): run {prepare_command(name)} again"
        )
    itemsize = np.dtype(DTYPES[meta["dtype"]]).itemsize
    for split in ("train", "val"):
        path = folder / f"{split}.bin"
        try:
            size = regular_size(inside(folder, f"{split}.bin", "the dataset file"), path)
        except FileNotFoundError:
            raise UserError(f"{path} is missing: run {prepare_command(name)} again")
        expected = meta["num_tokens"].get(split)
        if size % itemsize or size // itemsize != expected:
            raise UserError(
                f"{path} holds {size} bytes but meta.json says {expected} tokens of "
                f"{meta['dtype']} ({expected and expected * itemsize} bytes): the file is "
                f"truncated or stale; run {prepare_command(name)} again"
            )
    meta.setdefault("fingerprint", None)
    meta.setdefault("eot_id", None)
    if meta["tokenizer"].get("type") == "bpe":
        from gptkit.data.tokenizer import embed_bpe_file

        # tokenizer.json's text joins the description, so every checkpoint embeds the tokenizer itself
        meta["tokenizer"] = embed_bpe_file(meta["tokenizer"], folder)
    check_vocabulary(meta, meta_path)
    for split in ("train", "val"):
        if meta["num_tokens"][split] * itemsize <= FULL_SCAN_BYTES:  # larger ones: each batch as it is read
            check_token_ids(folder / f"{split}.bin", meta["dtype"], meta["vocab_size"], name)
    if "chat" in meta:
        for split in ("train", "val"):
            check_mask_file(folder, split, meta["num_tokens"][split], name)
    if block_size is not None:
        check_block_size(meta, block_size, folder)
    return meta


def check_mask_file(folder, split, n_tokens, name):
    """A chat split's target mask: one uint8 per token (gptkit/prepare/chat.py)."""
    path = folder / f"{split}_mask.bin"
    again = f"python prepare.py {name}" if name in AUTO_PREPARED else f"python prepare.py {name} --input FILE --format chat"
    try:
        size = regular_size(inside(folder, path.name, "the dataset file"), path)
    except FileNotFoundError:
        raise UserError(f"{path} is missing: run {again} again")
    if size != n_tokens:
        raise UserError(f"{path} holds {size} bytes but meta.json says {n_tokens} tokens: run {again} again")
    mask = np.fromfile(path, dtype=np.uint8)
    if mask.size and (int(mask.max()) > 2 or mask[0] != 2):
        raise UserError(f"{path} is not a target mask (values 0, 1, 2, starting with 2): run {again} again")


def read_meta_file(folder, meta_path, fix):
    """meta.json's object: a regular file inside the folder, of bounded size, valid JSON."""
    try:
        raw = read_regular(inside(folder, "meta.json", "the dataset file"), MAX_META_BYTES, meta_path)
        meta = json.loads(raw)
    except (ValueError, RecursionError) as e:  # ValueError: bad JSON, bad UTF-8, a number of 4,300+ digits
        raise UserError(f"{meta_path} is not valid JSON ({str(e)[:200] or 'nested too deeply'}): {fix}")
    if not isinstance(meta, dict):
        raise UserError(f"{meta_path} holds a {type(meta).__name__}, not an object: {fix}")
    return meta


def check_vocabulary(meta, meta_path):
    """The tokenizer meta.json describes (checked whole, whatever its pin says) must
    agree with vocab_size, and eot_id lie inside that vocabulary."""
    expected = check_description(meta["tokenizer"], meta_path)
    if "chat" in meta:  # the turn (and tool) tokens follow the tokenizer's ids (gptkit/data/chat.py)
        from gptkit.data.chat import check_chat_meta

        expected += check_chat_meta(meta, expected, meta_path)
    if expected != meta["vocab_size"]:
        raise UserError(
            f"{meta_path}: vocab_size {meta['vocab_size']} disagrees with its {meta['tokenizer'].get('type')} tokenizer "
            f"({expected} tokens): the file was edited or is stale; run prepare.py again"
        )
    eot = meta.get("eot_id")
    if eot is not None and (not isinstance(eot, int) or isinstance(eot, bool) or not 0 <= eot < meta["vocab_size"]):
        raise UserError(f"{meta_path}: eot_id {str(eot)[:40]} is not an id of its {meta['vocab_size']}-token vocabulary")


def check_token_ids(path, dtype, vocab_size, name=None, offset=0, ids=None):
    """Every token id in the file (or in `ids`, read from it at token `offset`) must be
    below vocab_size: a larger id would index past the embedding table."""
    if ids is None:
        ids = np.memmap(path, dtype=DTYPES[dtype], mode="r") if os.path.getsize(path) else np.zeros(0, np.uint16)
    worst = int(ids.max()) if ids.size else 0
    if worst >= vocab_size:
        where = offset + int(np.argmax(np.asarray(ids).reshape(-1) >= vocab_size))
        fix = f"run {prepare_command(name)} again" if name else "prepare the dataset again"
        raise UserError(
            f"{path} holds token id {worst} (first bad id at token {where:,}), but the vocabulary has "
            f"{vocab_size} ids: the bins do not match meta.json; {fix}"
        )


def check_block_size(meta, block_size, folder):
    """Each split must hold at least one window of block_size+1 tokens (a chat split's
    conversations are padded into whole windows: any length will do)."""
    if "chat" in meta:
        return
    for split in ("train", "val"):
        n = meta["num_tokens"][split]
        if n < block_size + 1:
            raise UserError(
                f"{Path(folder) / (split + '.bin')} has {n} tokens, fewer than one window of "
                f"block_size+1 = {block_size + 1}: use a smaller --block_size or more data"
            )


def global_batch_offsets(seed, step, n_tokens, block_size, global_batch):
    """Start offsets of the `global_batch` windows of iteration `step`: int64 (N,).

    A pure function of its arguments (a fresh generator seeded with (seed, step)),
    so the data order needs no saved state and is the same for any number of
    ranks. Each window is block_size+1 tokens: inputs and the next-token targets."""
    assert n_tokens > block_size, f"{n_tokens} tokens cannot hold a window of {block_size + 1}"
    rng = np.random.default_rng([seed, step])
    return rng.integers(0, n_tokens - block_size, size=global_batch, dtype=np.int64)


def micro_batch_offsets(offsets, batch_size, chunk):
    """The windows of micro-batch `chunk` (= rank * local_accum + micro_step)."""
    out = offsets[chunk * batch_size : (chunk + 1) * batch_size]
    assert len(out) == batch_size, f"chunk {chunk} of {len(offsets)} offsets is short"
    return out


def eval_offsets(seed, split, n_tokens, block_size, batch_size, eval_iters):
    """The windows that estimate a split's loss, as a list of int64 arrays (batches).

    eval_iters > 0: the same eval_iters * batch_size random windows at every
    evaluation (a fixed sample, so changes in the curve are the model's, not the
    sample's). eval_iters == 0: the whole split in consecutive, non-overlapping
    windows (the last batch may be smaller)."""
    if eval_iters == 0:
        starts = np.arange(0, n_tokens - block_size, block_size, dtype=np.int64)
    else:
        stream = {"train": 0, "val": 1}[split]
        rng = np.random.default_rng([seed, scoring.EVAL_STREAM, stream])
        starts = rng.integers(0, n_tokens - block_size, size=eval_iters * batch_size, dtype=np.int64)
    return [starts[i : i + batch_size] for i in range(0, len(starts), batch_size)]


class TokenBin:
    """One split's token file, read window by window with os.pread."""

    def __init__(self, path, dtype):
        self.path = Path(path)
        self.dtype = np.dtype(DTYPES[dtype] if isinstance(dtype, str) else dtype)
        self.fd = os.open(self.path, os.O_RDONLY)
        self.n_tokens = os.fstat(self.fd).st_size // self.dtype.itemsize

    def read_windows(self, offsets, length, vocab_size=None):
        """Token ids of the windows starting at `offsets`, each `length` long: (B, length) int64.
        With vocab_size, an id outside the vocabulary is a UserError naming the file."""
        out = np.empty((len(offsets), length), dtype=self.dtype)
        nbytes = length * self.dtype.itemsize
        for row, start in enumerate(offsets):
            got = os.preadv(self.fd, [memoryview(out[row]).cast("B")], int(start) * self.dtype.itemsize)
            if got != nbytes:
                raise UserError(f"short read from {self.path} at token {start}: {got} of {nbytes} bytes (was it truncated?)")
        if vocab_size is not None and out.size and int(out.max()) >= vocab_size:
            row = int(np.argmax((out >= vocab_size).any(axis=1)))
            check_token_ids(self.path, None, vocab_size, offset=int(offsets[row]), ids=out[row])
        return out.astype(np.int64)

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def open_batches(data_dir, name, meta, block_size, device, batch_size, accumulation, seed):
    """The batch reader of a dataset, chosen once: random windows of a text (Batches),
    or whole conversations packed into windows (gptkit/data/chat_batches.py's ChatBatches),
    whose targets are the replies alone. Either gives train.py (x, y) micro-batches, with
    y = -1 where nothing is learned, and the step's target count."""
    reader = ChatBatches if "chat" in meta else Batches
    return reader(data_dir, name, meta, block_size, device, batch_size, accumulation, seed)


class Batches:
    """The (x, y) tensors of any window list, moved to the device.

    On CUDA the host tensors are pinned and copied asynchronously; PyTorch's
    pinned-memory allocator keeps each buffer until its copy has finished."""

    def __init__(self, data_dir, name, meta, block_size, device, batch_size=None, accumulation=None, seed=0):
        folder = dataset_dir(data_dir, name)
        self.splits = {s: TokenBin(folder / f"{s}.bin", meta["dtype"]) for s in ("train", "val")}
        self.block_size = block_size
        self.vocab_size = meta["vocab_size"]
        self.device = torch.device(device)
        self.batch_size, self.accumulation, self.seed = batch_size, accumulation, seed

    def micro_batches(self, step, rank=0, world_size=1):
        """This rank's (x, y) micro-batches of iteration `step`: the global batch of
        batch_size * accumulation windows is cut into `accumulation` micro-batches,
        rank r taking the r-th run of accumulation / world_size of them. Read one
        at a time, as the loop asks for them."""
        offsets = global_batch_offsets(self.seed, step, self.n_tokens("train"), self.block_size,
                                       self.batch_size * self.accumulation)
        local = self.per_rank(world_size)
        for chunk in range(rank * local, (rank + 1) * local):
            yield self.get("train", micro_batch_offsets(offsets, self.batch_size, chunk))

    def tokens_per_step(self):
        """Tokens a step reads (every window's block_size inputs), for the log's tok/s."""
        return self.batch_size * self.accumulation * self.block_size

    def per_rank(self, world_size):
        """How many of each iteration's micro-batches each of `world_size` ranks takes."""
        return self.accumulation // world_size

    def targets(self, step):
        """The target tokens in `step`'s whole global batch: every window's block_size."""
        return self.batch_size * self.accumulation * self.block_size

    def eval_plan(self, eval_iters, seed, byte_lengths, autocast, dist):
        """The same random sample of eval_iters batches at every evaluation; with
        eval_iters=0 every token of the val split once (the figure compared), and a
        train sample of FULL_EVAL_TRAIN_BATCHES batches."""
        T, B = self.block_size, self.batch_size
        windows = {}
        for split in ("train", "val"):
            starts = eval_offsets(seed, split, self.n_tokens(split), T, B,
                                  eval_iters or scoring.FULL_EVAL_TRAIN_BATCHES)
            windows[split] = scoring.sample_windows(np.concatenate(starts), T)
        if eval_iters == 0:
            windows["val"] = scoring.plan_windows([self.n_tokens("val")], T, T)
        return scoring.EvalPlan(self.scored_windows, windows, B, T, byte_lengths, autocast, dist,
                                self.device)

    def scored_windows(self, split, rows):
        """(x, y) on the device for rows of scoring.plan_windows, y = -1 where not scored."""
        read = lambda _, start, n: self.read(split, start, n)  # noqa: E731
        x, y = scoring.window_batch(read, rows, self.block_size)
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def n_tokens(self, split):
        return self.splits[split].n_tokens

    def read(self, split, start, n):
        """n tokens of a split from `start`, as a numpy array (for gptkit.evals.scoring)."""
        return self.splits[split].read_windows([start], n, self.vocab_size)[0]

    def get(self, split, offsets):
        windows = torch.from_numpy(self.splits[split].read_windows(offsets, self.block_size + 1, self.vocab_size))
        x = windows[:, :-1].contiguous()  # (B, T) inputs
        y = windows[:, 1:].contiguous()  # (B, T) targets: the next token
        if self.device.type == "cuda":
            x = x.pin_memory().to(self.device, non_blocking=True)
            y = y.pin_memory().to(self.device, non_blocking=True)
        elif self.device.type != "cpu":
            x, y = x.to(self.device), y.to(self.device)
        return x, y

    def close(self):
        for b in self.splits.values():
            b.close()
