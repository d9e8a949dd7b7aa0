"""Build a chat dataset folder: data/NAME/{train.bin, val.bin, train_mask.bin, val_mask.bin, meta.json}.

    python prepare.py chat --input talks.jsonl --format chat --tokenizer gpt2
    python prepare.py chat --input convs/ --format chat --tokenizer char --block_size 256 --errors skip

The bins hold the conversations one after another, whole, as gptkit/data/chat.py encodes
them (turn tokens are the ids just past the tokenizer's vocabulary); each *_mask.bin
holds one uint8 per token: 1 for a target (an assistant's content, its tool calls and its <|end|>),
2 for the first token of a conversation (its first turn token, never a target), 0 for
the rest. train.py packs whole conversations into windows (gptkit/data/chat_batches.py).
The split keeps conversations whole: every k-th one, evenly spaced, is held out.
meta.json says "chat" (the template, its turn ids and, when a conversation calls a tool, the
tool tokens' ids, how many conversations and how
many lines were skipped), is written last, and only after every input line is
checked: a bad line ends the run with nothing written.
"""

import os
import secrets
import sys
from pathlib import Path

import numpy as np

from gptkit.data.chat import (CHAT_TOKENS, TEMPLATE, TURN_TOKENS, call_expression, encode_records, has_tool_calls,
                              read_messages, tool_ids, turn_ids)
from gptkit.ops.errors import UserError
from gptkit.ops.paths import TEMP_MARK, claim_output
from gptkit.prepare.encode import dtype_for
from gptkit.data.tokenizer import BPE_FILE, CharTokenizer, GPT2Tokenizer

TARGET, START = 1, 2  # the mask's values besides 0 (context)
ERRORS = ("strict", "skip")


def split_conversations(n, val_fraction):
    """Indices of the held-out conversations: round(n * val_fraction) of them (at least
    one), evenly spaced, so that the val split samples the whole input."""
    if n < 2:
        raise UserError(f"{n} conversation(s): a train and a val split need at least 2")
    n_val = min(n - 1, max(1, round(n * val_fraction)))
    return {int((i + 0.5) * n / n_val) for i in range(n_val)}


def make_tokenizer(kind, texts, vocab_size, bpe):
    """The base tokenizer: characters of every message, GPT-2's BPE, or a BPE trained on
    the training split's messages (`texts`) or reused (`bpe`)."""
    if kind == "char":
        return CharTokenizer(sorted(set("".join(texts))))
    if kind == "gpt2":
        return GPT2Tokenizer()
    if bpe is not None:
        return bpe
    from gptkit.prepare.bpe import train_bpe

    return train_bpe(iter(texts), vocab_size)


def texts_of(message):
    """The texts of one message a tokenizer must encode: its content and its calls' expressions."""
    return [message["content"], *(call_expression(c) for c in message.get("tool_calls") or [])]


def pack_split(conversations):
    """The ids and the mask (0, TARGET, START) of conversations laid end to end."""
    ids = [i for c, _ in conversations for i in c]
    mask = []
    for _, m in conversations:
        mask += [START, *m[1:]]
    return ids, mask


def prepare_chat_dataset(inputs, kind, folder, val_fraction, errors, block_size, vocab_size, bpe, progress):
    """Read, check, tokenize and write a chat dataset into `folder` (claimed by the
    caller); returns its meta. A bad line raises before anything is written."""
    from gptkit.prepare.build import FORMAT_VERSION, commit_dataset, fingerprint, meta_json, write_synced

    if errors not in ERRORS:
        raise UserError(f"--errors with --format chat must be strict or skip, got {errors!r}")
    mode = "skip" if errors == "skip" else "raise"
    records, bad = read_messages([Path(p) for p in inputs], mode)
    held_out = split_conversations(len(records), val_fraction)
    train_texts = [t for i, (_, msgs) in enumerate(records) if i not in held_out for m in msgs for t in texts_of(m)]
    all_texts = [t for _, msgs in records for m in msgs for t in texts_of(m)]
    tools = any(has_tool_calls(msgs) for _, msgs in records)  # the 4 tool tokens too
    tokenizer = make_tokenizer(kind, all_texts if kind == "char" else train_texts, vocab_size, bpe)
    base = tokenizer.vocab_size
    splits = {"train": [], "val": []}
    for i, record in enumerate(records):
        splits["val" if i in held_out else "train"].append(record)
    encoded, too_long = {}, 0
    for split, rows in splits.items():
        encoded[split], n = encode_records(rows, tokenizer.encode, base, block_size, mode)
        too_long += n
        if not encoded[split]:
            raise UserError(f"no {split} conversation is left after skipping {bad + too_long} bad line(s)")

    specials = CHAT_TOKENS if tools else TURN_TOKENS
    vocab = base + len(specials)
    dtype = dtype_for(vocab)
    tag = f"{TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"
    names = ["train.bin", "val.bin", "train_mask.bin", "val_mask.bin"] + ([BPE_FILE] if kind == "bpe" else []) + ["meta.json"]
    tmp = {name: folder / f".{name}{tag}" for name in names}
    counts = {}
    try:
        for split, conversations in encoded.items():
            ids, mask = pack_split(conversations)
            counts[split] = len(ids)
            write_array(tmp[f"{split}.bin"], np.asarray(ids, dtype=dtype))
            write_array(tmp[f"{split}_mask.bin"], np.asarray(mask, dtype=np.uint8))
        if kind == "bpe":
            write_synced(tmp[BPE_FILE], tokenizer.to_json())
        meta = {
            "format_version": FORMAT_VERSION,
            "tokenizer": tokenizer.describe() if kind == "bpe" else tokenizer.to_dict(),
            "vocab_size": vocab,
            "dtype": dtype,
            "eot_id": None,
            "num_tokens": counts,
            "sources": [{"path": str(p)} for p in inputs],
            "split": {"rule": "whole conversations, evenly spaced", "val_fraction": val_fraction},
            "chat": {
                "template": TEMPLATE,
                "turn_ids": turn_ids(base),
                **({"tool_ids": tool_ids(base)} if tools else {}),
                "conversations": {s: len(c) for s, c in encoded.items()},
                "skipped": bad + too_long,
                "block_size": block_size,
            },
        }
        meta["fingerprint"] = fingerprint(meta | {"sources": [{"sha256": digest(encoded)}]})
        write_synced(tmp["meta.json"], meta_json(meta))
        commit_dataset(folder, tmp, names)
    finally:
        for path in tmp.values():
            path.unlink(missing_ok=True)
    if progress:
        c = meta["chat"]["conversations"]
        print(f"wrote {folder}: train {c['train']:,} conversations ({counts['train']:,} tokens), val {c['val']:,} "
              f"({counts['val']:,} tokens), vocab {vocab:,} with the {len(specials)} special tokens; skipped {bad + too_long} line(s)",
              file=sys.stderr)
    return meta


def digest(encoded):
    """sha256 of the encoded conversations: the dataset's content, for its fingerprint."""
    import hashlib

    h = hashlib.sha256()
    for split in ("train", "val"):
        for ids, mask in encoded[split]:
            h.update(np.asarray(ids, dtype=np.int64).tobytes() + np.asarray(mask, dtype=np.uint8).tobytes())
    return h.hexdigest()


def write_array(path, array):
    with open(path, "wb") as f:
        f.write(array.tobytes())
        f.flush()
        os.fsync(f.fileno())


def prepare_chat(inputs, kind, name, out_dir="data", val_fraction=0.1, errors="strict", block_size=None,
                 vocab_size=None, tokenizer_from=None, progress=True):
    """prepare.py --format chat: check the settings, claim and lock out_dir/name, write; the folder."""
    from gptkit.prepare.build import TOKENIZERS, check_bpe_settings, check_name, locked_dataset_folder

    if kind not in TOKENIZERS:
        raise UserError(f"unknown tokenizer {kind!r}: choose one of {', '.join(TOKENIZERS)}")
    bpe = check_bpe_settings(kind, vocab_size, tokenizer_from)
    check_name(name)
    if not 0 < val_fraction < 1:
        raise UserError(f"--val_fraction must be between 0 and 1 (exclusive), got {val_fraction}")
    if block_size is not None and block_size < 1:
        raise UserError(f"--block_size must be at least 1, got {block_size}")
    folder = claim_output(Path(out_dir) / name, "folder", overwrite=True, what="the dataset folder (--data_dir/--name)")
    with locked_dataset_folder(folder):
        prepare_chat_dataset(inputs, kind, folder, val_fraction, errors, block_size, vocab_size, bpe, progress)
    return folder
