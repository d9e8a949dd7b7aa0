"""Training prepare.py's byte-level BPE, or taking one from another dataset or checkpoint.

    python prepare.py --input books/ --tokenizer bpe --vocab_size 4096 --name books
    python prepare.py --input more/ --tokenizer bpe --tokenizer_from data/books --name more

Training reads the training split only, streamed as the same ~1 MB strings
the encoder gets (cut where GPT-2's pre-tokenizer cuts anyway, so no word is
split by a chunk boundary), into rustbpe, which counts pre-tokens in parallel
and learns the merges. Memory holds the count of each distinct pre-token (a
word with its leading space, a number, ...) and a bounded buffer of text, not
the corpus. Why rustbpe (+ tiktoken to encode) over Hugging Face `tokenizers`:
on the same 100 MB corpus it trained in a fifth of the CPU time and of the peak
memory, and tiktoken encoded 5-8x faster on one core, to the same token count
(BENCHMARKS.md, `python bench.py tokenizer`). rustbpe is only needed to train:
the saved tokenizer is plain JSON that tiktoken (already a dependency) runs.
"""

import os
from pathlib import Path

from gptkit.ops.errors import UserError
from gptkit.data.tokenizer import BPE_FILE, GPT2_PATTERN, MAX_BPE_VOCAB, MIN_BPE_VOCAB, BPETokenizer, tokenizer_from_dict



def train_buffer_strings():
    """How many strings rustbpe takes from the iterator before counting them on all
    cores: two per core keeps every core busy, and with ~1 MB strings only a few MB
    of text per core are in memory at a time (rustbpe's default, 8,192, is ~8 GB)."""
    return max(8, 2 * (os.cpu_count() or 1))


def check_vocab_size(vocab_size):
    """A UserError unless a BPE of `vocab_size` ids (bytes + merges + <|endoftext|>) can exist."""
    if not isinstance(vocab_size, int) or vocab_size < MIN_BPE_VOCAB:
        raise UserError(
            f"--vocab_size {vocab_size} is too small: a byte-level BPE has the 256 bytes and "
            f"<|endoftext|>, so at least {MIN_BPE_VOCAB} ids (then one merge per id above that)"
        )
    if vocab_size > MAX_BPE_VOCAB:
        raise UserError(
            f"--vocab_size {vocab_size:,} does not fit the widest token dtype, uint32 (at most {MAX_BPE_VOCAB:,} ids)"
        )


def train_bpe(texts, vocab_size):
    """Learn vocab_size - 257 merges from an iterator of strings; a BPETokenizer.

    Raises UserError when the text has too few distinct pairs to learn them all."""
    check_vocab_size(vocab_size)
    try:
        import rustbpe
    except ImportError:
        raise UserError("training a BPE needs rustbpe: pip install rustbpe (or reuse one with --tokenizer_from)")

    trainer = rustbpe.Tokenizer()
    # rustbpe's vocabulary counts the 256 bytes and the merges; <|endoftext|> comes on top
    trainer.train_from_iterator(texts, vocab_size - 1, buffer_size=train_buffer_strings(), pattern=GPT2_PATTERN)
    ranks = sorted(trainer.get_mergeable_ranks(), key=lambda pair: pair[1])
    assert [r for _, r in ranks] == list(range(len(ranks))), "rustbpe's ranks are not 0..n-1"
    learned = len(ranks) - 256
    wanted = vocab_size - MIN_BPE_VOCAB
    if learned < wanted:
        raise UserError(
            f"the training text is too small for --vocab_size {vocab_size:,}: it gave only {learned:,} of the "
            f"{wanted:,} merges (every pair of tokens left occurs once or never). Use --vocab_size "
            f"{learned + MIN_BPE_VOCAB:,} or less, or give more text"
        )
    return BPETokenizer([bytes(b) for b, _ in ranks])


def tokenizer_from_path(path):
    """The BPETokenizer in a dataset folder (its meta.json), an out_dir (best.pt or
    ckpt.pt), a checkpoint file, or a tokenizer.json file; UserError if none is there."""
    from gptkit.data.tokenizer import BPE_FORMAT, MAX_BPE_FILE_BYTES, embed_bpe_file
    from gptkit.ops.untrusted import inside, read_regular, regular_size

    path = Path(path)
    if not path.exists():
        raise UserError(f"--tokenizer_from {path} does not exist")
    if path.is_dir():
        if os.path.lexists(path / "meta.json"):
            import json

            try:
                raw = read_regular(inside(path, "meta.json", f"--tokenizer_from {path}/meta.json"), MAX_BPE_FILE_BYTES,
                                   f"--tokenizer_from {path}/meta.json")
                meta = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise UserError(f"--tokenizer_from {path}: its meta.json is not valid JSON ({e})")
            return _bpe_only(meta.get("tokenizer") if isinstance(meta, dict) else None, path, embed_bpe_file)
        found = next((path / n for n in ("best.pt", "ckpt.pt") if (path / n).is_file()), None)
        if found is None:
            raise UserError(
                f"--tokenizer_from {path} holds no tokenizer: expected a dataset folder (meta.json and "
                f"{BPE_FILE}), an out_dir with best.pt or ckpt.pt, a checkpoint file or a {BPE_FILE}"
            )
        path = found
    # The user named this path: a link to a file is fine, a FIFO (which would block forever) or device is not.
    regular_size(path.resolve(), f"--tokenizer_from {path}")
    if path.suffix == ".json":
        text = read_regular(path.resolve(), MAX_BPE_FILE_BYTES, f"--tokenizer_from {path}").decode("utf-8", "replace")
        if BPE_FORMAT not in text[:200]:
            raise UserError(f"--tokenizer_from {path} is not a {BPE_FILE} written by prepare.py")
        return BPETokenizer.from_json(text, str(path))
    from gptkit.ops.checkpoint import load_checkpoint

    ckpt = load_checkpoint(path)  # refuses pickled code; UserError for a damaged file
    return _bpe_only(ckpt.get("tokenizer") if isinstance(ckpt, dict) else None, path, None)


def _bpe_only(description, path, embed):
    kind = description.get("type") if isinstance(description, dict) else None
    if kind != "bpe":
        what = f"a {kind} tokenizer" if kind else "no tokenizer"
        fix = f"; use --tokenizer {kind} for that one" if kind in ("char", "gpt2") else ""
        raise UserError(f"--tokenizer_from {path} holds {what}, not a BPE trained by prepare.py{fix}")
    if embed is not None:
        description = embed(description, path)
    return tokenizer_from_dict(description)
