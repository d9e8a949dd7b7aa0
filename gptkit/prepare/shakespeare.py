"""Tiny Shakespeare for prepare.py: which local copy to use, or a checked download.

The copy comes from, in order: --input, $TINYSHAKESPEARE, data/NAME/input.txt
(a verified earlier download, kept there as nanoGPT does), or a download from
the URL nanoGPT uses (gptkit/prepare/download.py's fetch_whole: at most the file's
1,115,394 bytes, through a temporary file), then checked against its sha256.
"""

import hashlib
import os
import sys
from pathlib import Path

from gptkit.ops.errors import UserError
from gptkit.prepare.download import fetch_whole


# nanoGPT's data/shakespeare_char/prepare.py downloads from this URL; the sha256
# is of that file (1,115,394 bytes).
SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
SHAKESPEARE_BYTES = 1_115_394


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def download_shakespeare(dest):
    """Download Tiny Shakespeare to `dest` through a temporary file, checking its sha256."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    hint = "pass --input PATH to a local copy (or set TINYSHAKESPEARE=PATH)"
    return fetch_whole(SHAKESPEARE_URL, dest, SHAKESPEARE_BYTES, "Tiny Shakespeare", f": {hint}", SHAKESPEARE_SHA256)


def shakespeare_input(folder, input_path):
    """The local Tiny Shakespeare to use: --input, $TINYSHAKESPEARE, a cached download, or a new download."""
    where = "--input"
    if input_path is None and os.environ.get("TINYSHAKESPEARE"):
        input_path, where = os.environ["TINYSHAKESPEARE"], "TINYSHAKESPEARE"
        if not Path(input_path).is_file():
            raise UserError(f"TINYSHAKESPEARE={input_path} is not a file: point it at Tiny Shakespeare's input.txt")
    if input_path is not None:
        path = Path(input_path)
        if path.is_file():
            warn_if_not_shakespeare(path, where)
        return path
    cached = folder / "input.txt"  # where a verified download is kept, as nanoGPT does
    if cached.is_file() and sha256_file(cached) == SHAKESPEARE_SHA256:
        return cached
    created = [p for p in (folder, *folder.parents) if not p.exists()]  # deepest first
    try:
        return download_shakespeare(cached)
    except BaseException:
        for made in created:  # an offline attempt leaves no empty data/ folders behind
            if made.is_dir() and not any(made.iterdir()):
                made.rmdir()
        raise


def warn_if_not_shakespeare(path, where):
    """A warning (the text is still used: it may be a deliberate variant) when `path` is not
    the file nanoGPT downloads, with both sizes, so a wrong file is never taken silently."""
    size = path.stat().st_size
    if size == SHAKESPEARE_BYTES and sha256_file(path) == SHAKESPEARE_SHA256:
        return
    print(
        f"warning: {where}={path} is not Tiny Shakespeare as nanoGPT downloads it ({size:,} bytes, expected "
        f"{SHAKESPEARE_BYTES:,} with sha256 {SHAKESPEARE_SHA256[:12]}...): preparing from it anyway, but the "
        "token counts and losses in README.md and docs/data.md will not match",
        file=sys.stderr,
    )
