"""prepare.py's first pass and its train/val split.

The first pass streams every input once: it checks that the text decodes and
parses, counts documents and characters, hashes each source for meta.json and,
for the character tokenizer, collects the vocabulary (in the worker pool). The
split is then fixed before any token is written:

    one document    its first int(n * (1 - val_fraction)) characters are train
                    (nanoGPT: train = data[:int(n*0.9)]), the rest val
    N documents     V = min(max(1, round(N * val_fraction)), N - 1) whole
                    documents, evenly spaced through the input, are val
"""

import hashlib
from dataclasses import dataclass

import numpy as np

from gptkit.ops.errors import UserError
from gptkit.prepare.encode import MAX_CODE_POINT, batched_text, charset_task, ordered_map
from gptkit.prepare.sources import iter_documents


@dataclass
class Scan:
    """What the first pass learns: enough to split, size the vocabulary, describe sources."""

    n_docs: int
    n_chars: int
    chars: list  # the sorted distinct characters (char tokenizer only)
    sources: list  # [{"path", "bytes", "sha256"}]


def scan_inputs(sources, errors, want_chars, pool, workers, bar):
    """Stream every input once (raising UserError on bad text) and return a Scan."""
    hashers = [hashlib.sha256() for _ in sources]
    sizes = [0] * len(sources)
    counts = {"docs": 0, "chars": 0}

    def on_raw(i, block):
        hashers[i].update(block)
        sizes[i] += len(block)
        bar.update(len(block))

    def pieces():
        for doc in iter_documents(sources, errors, on_raw):
            counts["docs"] += 1
            for piece in doc:
                counts["chars"] += len(piece)
                yield piece

    chars = []
    if want_chars:
        seen = np.zeros(MAX_CODE_POINT + 1, dtype=bool)
        for cps in ordered_map(pool, charset_task, batched_text(pieces()), workers):
            seen[cps] = True
        chars = [chr(c) for c in np.flatnonzero(seen)]
    else:
        for _ in pieces():
            pass
    described = [{"path": s.shown, "bytes": n, "sha256": h.hexdigest()} for s, n, h in zip(sources, sizes, hashers)]
    return Scan(counts["docs"], counts["chars"], chars, described)


# ---------------------------------------------------------------- the split


def plan_split(scan, val_fraction, shown):
    """The split rule for meta.json, and a function docs -> (split, pieces) segments."""
    if scan.n_docs == 0:
        raise UserError(f"the input is empty: {shown} hold(s) no text")
    if scan.n_docs == 1:
        n = scan.n_chars
        n_train = int(n * (1 - val_fraction))  # nanoGPT: train = data[:int(n*0.9)]
        if n_train == 0 or n_train == n:
            raise UserError(
                f"the input is too short to split: {n} character(s) give {n_train} for train and "
                f"{n - n_train} for val at --val_fraction {val_fraction}; give more text"
            )
        rule = {
            "rule": "one document: its first int(n * (1 - val_fraction)) characters are train, the rest val",
            "val_fraction": val_fraction,
            "num_documents": 1,
            "num_chars": {"train": n_train, "val": n - n_train},
        }
        return rule, lambda docs: single_document_segments(next(iter(docs)), n_train)
    n_docs = scan.n_docs
    n_val = min(max(1, round(n_docs * val_fraction)), n_docs - 1)
    rule = {
        "rule": "whole documents, in input order, empty ones skipped: with N documents and "
        "V = min(max(1, round(N * val_fraction)), N - 1), document i (from 0) is val when "
        "(i + 1) * V // N > i * V // N, so V evenly spaced documents are val",
        "val_fraction": val_fraction,
        "num_documents": n_docs,
        "num_val_documents": n_val,
    }

    def segments(docs):
        for i, doc in enumerate(docs):
            yield ("val" if (i + 1) * n_val // n_docs > i * n_val // n_docs else "train"), doc

    return rule, segments


def single_document_segments(pieces, n_train):
    """("train", the first n_train characters) then ("val", the rest), both streamed."""
    pieces = iter(pieces)
    carry = []

    def train():
        seen = 0
        for piece in pieces:
            if seen + len(piece) <= n_train:
                seen += len(piece)
                yield piece
            else:
                yield piece[: n_train - seen]
                carry.append(piece[n_train - seen :])
                return

    def val():
        yield from carry
        yield from pieces

    yield "train", train()
    yield "val", val()
