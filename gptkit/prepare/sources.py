"""prepare.py's inputs, read as a stream of documents with errors a user can act on.

An input PATH is one of:
    a text file       one document
    a folder          every `.txt` file below it, in sorted order, one document each
    a `.jsonl` file   one document per line, in its "text" field (blank lines skipped)

Text is decoded as UTF-8 in blocks of about a mebibyte, never splitting a
multi-byte character, so a file of any size streams through in bounded memory.
Empty documents (an empty file, `"text": ""`) are skipped, identically in every
pass, so that document numbers are stable.
"""

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from gptkit.errors import UserError

BLOCK_BYTES = 1 << 20  # read size: large enough that per-block overhead is noise


@dataclass(frozen=True)
class Source:
    path: Path
    kind: str  # "text" or "jsonl"
    shown: str  # the path as written in messages and meta.json


def resolve_inputs(paths):
    """Expand the user's PATHs into a list of Sources; raise UserError for a bad one."""
    if not paths:
        raise UserError("no input given: pass --input PATH [PATH ...]")
    sources = []
    for given in paths:
        path = Path(given)
        if not path.exists():
            raise UserError(f"input {given} does not exist")
        if path.is_dir():
            files = sorted(
                (f for f in path.rglob("*.txt") if f.is_file()),
                key=lambda f: f.relative_to(path).as_posix(),
            )
            if not files:
                raise UserError(f"input folder {given} holds no .txt files")
            sources += [Source(f, "text", str(f)) for f in files]
        elif path.suffix.lower() == ".jsonl":
            sources.append(Source(path, "jsonl", str(given)))
        else:
            sources.append(Source(path, "text", str(given)))
    for source in sources:
        try:
            with open(source.path, "rb"):
                pass
        except OSError as e:
            raise UserError(f"cannot read input {source.shown}: {e.strerror}")
    return sources


def complete_utf8_prefix(data):
    """Length of the longest prefix of `data` that does not end inside a UTF-8 character."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        byte = data[n - back]
        if byte & 0xC0 != 0x80:  # not a continuation byte: the last character starts here
            if byte >= 0xF0:
                need = 4
            elif byte >= 0xE0:
                need = 3
            elif byte >= 0xC0:
                need = 2
            else:
                need = 1
            return n if back >= need else n - back
    return n  # four continuation bytes in a row are invalid anyway: let the decoder say where


def decode(data, source, offset, errors):
    """Decode UTF-8 bytes that start at byte `offset` of `source`."""
    try:
        return data.decode("utf-8", errors)
    except UnicodeDecodeError as e:
        raise UserError(
            f"{source.shown} is not valid UTF-8 at byte offset {offset + e.start} ({e.reason}): "
            "fix the file, or pass --errors replace to replace bad bytes with U+FFFD"
        )


def text_pieces(source, errors, on_raw=None):
    """The text of a text file in pieces of about BLOCK_BYTES; `on_raw(bytes)` sees every raw block."""
    offset = 0  # byte offset of `pending`'s first byte in the file
    pending = b""
    with open(source.path, "rb") as f:
        while block := f.read(BLOCK_BYTES):
            if on_raw:
                on_raw(block)
            data = pending + block if pending else block
            cut = complete_utf8_prefix(data)
            if cut:
                yield decode(data[:cut], source, offset, errors)
            offset += cut
            pending = data[cut:]
    if pending:  # a truncated final character: strict decoding reports it
        yield decode(pending, source, offset, errors)


def jsonl_texts(source, errors, on_raw=None):
    """The "text" of each non-blank line of a .jsonl file."""
    offset = 0
    with open(source.path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if on_raw:
                on_raw(raw)
            line = decode(raw, source, offset, errors)
            offset += len(raw)
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{source.shown}, line {lineno}: not valid JSON ({e.msg}, column {e.colno})")
            if not isinstance(record, dict) or "text" not in record:
                raise UserError(f'{source.shown}, line {lineno}: no "text" field (each line must be {{"text": "..."}})')
            text = record["text"]
            if not isinstance(text, str):
                raise UserError(f'{source.shown}, line {lineno}: "text" is a {type(text).__name__}, not a string')
            yield scalar_values(text, source, lineno, errors)


LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def scalar_values(text, source, lineno, errors):
    """`text` as Unicode scalar values only. JSON can spell a lone surrogate ("\\ud800"),
    which is no character: it cannot be encoded as UTF-8, so no tokenizer can take it."""
    bad = LONE_SURROGATE.search(text)
    if bad is None:
        return text
    if errors == "replace":
        return LONE_SURROGATE.sub("\ufffd", text)
    raise UserError(
        f'{source.shown}, line {lineno}: "text" holds a lone surrogate U+{ord(bad.group()):04X} at character '
        f"{bad.start()} (not a Unicode character): fix the file, or pass --errors replace to replace it with U+FFFD"
    )


def iter_documents(sources, errors="strict", on_raw=None):
    """Yield each non-empty document as an iterator of text pieces, in input order.

    Consume each document's pieces before asking for the next one.
    `on_raw(source_index, raw_bytes)` is called for every raw block read (hashing, progress).
    """
    for index, source in enumerate(sources):
        raw_cb = (lambda b, i=index: on_raw(i, b)) if on_raw else None
        if source.kind == "jsonl":
            for text in jsonl_texts(source, errors, raw_cb):
                if text:
                    yield iter((text,))
        elif os.path.getsize(source.path) > 0:
            yield text_pieces(source, errors, raw_cb)
