"""prepare.py's inputs, read as a stream of documents with errors a user can act on.

An input PATH is one of:
    a text file       one document
    a folder          every `.txt` file below it, in sorted order, one document each
    a `.jsonl` file   one document per line, in its "text" field (blank lines skipped)
    a `.parquet` file one document per row, from its `text` column (or --text_column's):
                      gptkit/prepare/parquet.py
    a folder          also every `.parquet` file below it, in the same sorted order

    `-`               standard input, one document (a .jsonl from a pipe: name it, e.g. a FIFO x.jsonl)

A named pipe (FIFO) or a process substitution (`<(zcat books.txt.gz)`, which the
shell passes as /dev/fd/63) is a stream like `-`: it can be read only once, from
start to end, so prepare.py first copies it into its dataset folder (spool_streams)
and eval.py reads it as it goes. A device (/dev/zero) is refused.

Text is decoded as UTF-8 in blocks of about a mebibyte, never splitting a
multi-byte character, so a file of any size streams through in bounded memory.
Empty documents (an empty file, an empty pipe, `"text": ""`) are skipped,
identically in every pass, so that document numbers are stable: emptiness is
what was read, not the size the file system reports (a pipe's is 0).
"""

import contextlib
import json
import re
import shutil
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from gptkit.ops.errors import UserError
from gptkit.prepare.parquet import open_parquet, parquet_texts

BLOCK_BYTES = 1 << 20  # read size: large enough that per-block overhead is noise
STDIN = "-"


@dataclass(frozen=True)
class Source:
    path: Path
    kind: str  # "text", "jsonl" or "parquet"
    shown: str  # the path as written in messages and meta.json
    stream: bool = False  # standard input, a FIFO or a pipe: it can be read once only
    column: str = "text"  # a Parquet file's text column


INPUT_SUFFIXES = (".txt", ".parquet")  # what a folder contributes


def kind_of(path):
    return {".jsonl": "jsonl", ".parquet": "parquet"}.get(path.suffix.lower(), "text")


def resolve_inputs(paths, text_column="text"):
    """Expand the user's PATHs into a list of Sources; raise UserError for a bad one.
    `text_column` is the column read from Parquet files."""
    if not paths:
        raise UserError("no input given: pass --input PATH [PATH ...]")
    if list(paths).count(STDIN) > 1:
        raise UserError("--input names - (standard input) twice: it can be read only once")
    sources = []
    for given in paths:
        path = Path(given)
        if given == STDIN:
            sources.append(Source(path, "text", "-", stream=True))
            continue
        try:
            mode = path.stat().st_mode
        except (FileNotFoundError, NotADirectoryError):
            raise UserError(f"input {given} does not exist")
        except OSError as e:  # a name too long, a loop of symlinks
            raise UserError(f"cannot read input {given}: {e.strerror}")
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            if kind_of(path) == "parquet":
                raise UserError(f"input {given} is a pipe: Parquet is read from its end first, so give a file")
            sources.append(Source(path, kind_of(path), str(given), stream=True))
        elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
            raise UserError(f"input {given} is a device, not a text file or a pipe: give a file, a folder or -")
        elif path.is_dir():
            files = sorted(
                (f for f in path.rglob("*") if f.suffix in INPUT_SUFFIXES and f.is_file()),
                key=lambda f: f.relative_to(path).as_posix(),
            )
            if not files:
                raise UserError(f"input folder {given} holds no .txt or .parquet files")
            sources += [Source(f, kind_of(f), str(f), column=text_column) for f in files]
        else:
            sources.append(Source(path, kind_of(path), str(given), column=text_column))
    for source in sources:
        if source.stream:
            continue  # opening a FIFO waits for its writer: streams are opened once, to be read
        try:
            with open(source.path, "rb"):
                pass
        except OSError as e:
            raise UserError(f"cannot read input {source.shown}: {e.strerror}")
        if source.kind == "parquet":
            open_parquet(source.path, source.shown, source.column)  # not Parquet, no such column: now
    return sources


def open_source(source):
    """The source's bytes as a binary file (standard input is left open afterwards)."""
    if source.stream and source.shown == STDIN:
        return contextlib.nullcontext(sys.stdin.buffer)
    try:
        return open(source.path, "rb")
    except OSError as e:
        raise UserError(f"cannot read input {source.shown}: {e.strerror}")


def spool_streams(sources, folder, tag):
    """Copy each stream source once into a temporary file in `folder` (named with `tag`,
    so a killed run's copies are cleaned up like its other temporary files), for
    commands that read their input more than once. Returns (sources, copies made)."""
    out, copies = [], []
    for i, source in enumerate(sources):
        if not source.stream:
            out.append(source)
            continue
        copy = Path(folder) / f".input-{i}{tag}"
        copies.append(copy)
        try:
            with open_source(source) as f, open(copy, "wb") as g:
                shutil.copyfileobj(f, g, BLOCK_BYTES)
        except OSError as e:
            raise UserError(f"cannot read input {source.shown} into {folder}: {e.strerror or e}")
        out.append(Source(copy, source.kind, source.shown))
    return out, copies


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
    with open_source(source) as f:
        yield from _text_blocks(f, f.read(BLOCK_BYTES), source, errors, on_raw)


def _text_blocks(f, block, source, errors, on_raw):
    """text_pieces of an open file whose first block is already read."""
    offset = 0  # byte offset of `pending`'s first byte in the file
    pending = b""
    while block:
        if on_raw:
            on_raw(block)
        data = pending + block if pending else block
        cut = complete_utf8_prefix(data)
        if cut:
            yield decode(data[:cut], source, offset, errors)
        offset += cut
        pending = data[cut:]
        block = f.read(BLOCK_BYTES)
    if pending:  # a truncated final character: strict decoding reports it
        yield decode(pending, source, offset, errors)


def jsonl_texts(source, errors, on_raw=None):
    """The "text" of each non-blank line of a .jsonl file."""
    offset = 0
    with open_source(source) as f:
        for lineno, raw in enumerate(f, 1):
            if on_raw:
                on_raw(raw)
            line = decode(raw, source, offset, errors)
            offset += len(raw)
            if lineno == 1:
                line = line.removeprefix("\ufeff")  # a byte order mark some editors write
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{source.shown}, line {lineno}: not valid JSON ({e.msg}, column {e.colno})")
            except RecursionError:
                raise UserError(f"{source.shown}, line {lineno}: not JSON this reader takes: nested too deeply") from None
            except ValueError:  # an integer of over 4,300 digits (Python's limit on int("..."))
                raise UserError(f"{source.shown}, line {lineno}: not JSON this reader takes (a number of over 4,300 "
                                "digits)") from None
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
        if source.kind in ("jsonl", "parquet"):
            texts = jsonl_texts if source.kind == "jsonl" else parquet_texts
            for text in texts(source, errors, raw_cb):
                if text:
                    yield iter((text,))
        else:
            with open_source(source) as f:
                first = f.read(BLOCK_BYTES)  # empty or not is what was read (a pipe's size is 0)
                if first:
                    yield _text_blocks(f, first, source, errors, raw_cb)
