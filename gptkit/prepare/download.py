"""Downloading a published corpus's files from a Hugging Face dataset repository.

    list_files(base, repo, revision, folder)   the files below `folder`, with the size and
                                               sha256 the Hub's tree API gives for each
    fetch(url, dest, size, sha256, bar)        one file, resumable and checked

A file is written to DEST.part and renamed to DEST only after its size and sha256
(the Git LFS object id the Hub publishes) are checked, so DEST exists only when it
is complete and right; DEST.sha256 records the digest checked, so a later run
neither downloads nor reads it again (a file the publisher has changed since, or
one copied in by hand, is checked, and fetched again if it differs). A .part
left by a stopped run (Ctrl-C, a lost connection, kill -9) is continued with an
HTTP Range request from its last byte (in the same run, up to RETRIES times after
a lost connection, a timeout or a server's 429 or 5xx); a server that ignores Range
sends the whole file, which then replaces the .part. A file whose size or sha256 is wrong is
removed and refused in one line.

`base` is https://huggingface.co or a mirror that serves the same two routes
(api/datasets/REPO/tree/REVISION/PATH and datasets/REPO/resolve/REVISION/PATH).
"""

import hashlib
import http.client
import json
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from gptkit.ops.errors import UserError

BLOCK = 1 << 20
TIMEOUT_S = 60
RETRIES = 4  # a stopped download is continued this many times before giving up (waits 2, 4, 8, 16 s)
RETRY_WAIT_S = 2


@dataclass(frozen=True)
class RemoteFile:
    path: str  # inside the repository, e.g. sample/10BT/000_00000.parquet
    size: int
    sha256: str | None  # None for a file the Hub keeps outside LFS (no published sha256)


def _quote(text):
    return urllib.parse.quote(text, safe="")


def resolve_url(base, repo, revision, path):
    return f"{base.rstrip('/')}/datasets/{repo}/resolve/{_quote(revision)}/{urllib.parse.quote(path)}"


def tree_url(base, repo, revision, folder):
    return f"{base.rstrip('/')}/api/datasets/{repo}/tree/{_quote(revision)}/{urllib.parse.quote(folder)}"


def _why(e):
    """A network error in a few words: 'HTTP 404 Not Found', 'Connection refused'."""
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code} {e.reason}"
    if isinstance(e, http.client.IncompleteRead):
        return f"connection closed after {len(e.partial):,} more bytes"
    reason = getattr(e, "reason", None) or e
    return str(getattr(reason, "strerror", None) or reason or type(e).__name__)


def list_files(base, repo, revision, folder, suffix=".parquet"):
    """The RemoteFiles below `folder` whose names end in `suffix`, sorted by path."""
    url, files = tree_url(base, repo, revision, folder), []
    while url:
        try:
            with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
                entries = json.load(response)
                link = response.headers.get("Link", "")
        except (OSError, ValueError, http.client.HTTPException) as e:  # URLError, timeouts; ValueError: not JSON
            raise UserError(
                f"could not list {repo}/{folder} at {url} ({_why(e)}): offline, or a mirror? set --base_url "
                "or HF_ENDPOINT to one that serves the Hub's routes"
            )
        if not isinstance(entries, list):
            raise UserError(f"{url} did not answer with the Hub's file listing (a JSON list)")
        files += [f for entry in entries if (f := listed_file(entry, folder, suffix, url))]
        match = re.search(r'<([^>]+)>;\s*rel="next"', link)  # the Hub pages long listings
        url = match.group(1) if match else None
    if not files:
        raise UserError(f"{url or tree_url(base, repo, revision, folder)} lists no {suffix} files")
    return sorted(files, key=lambda f: f.path)


def listed_file(entry, folder, suffix, url):
    """A RemoteFile for one entry of the listing (None for a folder or another kind of
    file). Its path must lie inside `folder`: it becomes a path on this disk."""
    try:
        if entry.get("type") != "file" or not entry["path"].endswith(suffix):
            return None
        path, size, lfs = entry["path"], int(entry["size"]), entry.get("lfs") or {}
        sha256 = lfs.get("oid")
    except (AttributeError, KeyError, TypeError, ValueError):
        raise UserError(f"{url} answered with a listing entry that is not the Hub's: {str(entry)[:120]}") from None
    parts = path.split("/")
    if not path.startswith(folder.rstrip("/") + "/") or any(p in ("", ".", "..") for p in parts) or "\\" in path:
        raise UserError(f"{url} lists a file outside {folder}: {path[:200]!r}")
    if size < 0 or (sha256 is not None and not re.fullmatch(r"[0-9a-f]{64}", str(sha256))):
        raise UserError(f"{url} lists {path} with a size or sha256 that cannot be right")
    return RemoteFile(path, size, sha256)


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(BLOCK):
            h.update(block)
    return h.hexdigest()


def fetch(url, dest, size, sha256=None, bar=None):
    """Download url to dest (resuming dest.part), check size and sha256, rename into place."""
    dest = Path(dest)
    checked = dest.with_name(dest.name + ".sha256")
    if dest.is_file() and dest.stat().st_size == size:
        if sha256 is None:
            if bar is not None:
                bar.update(size)
            return dest
        recorded = checked.read_text().strip() if checked.is_file() else sha256_of(dest)
        if recorded == sha256:
            checked.write_text(sha256 + "\n")
            if bar is not None:
                bar.update(size)
            return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    have = part.stat().st_size if part.is_file() else 0
    if have > size:
        part.unlink()
        have = 0
    if bar is not None:
        bar.update(have)
    for attempt in range(RETRIES + 1):
        if have >= size:
            break
        try:
            _download(url, part, have, size, bar)
            break
        except Stopped as e:
            if attempt == RETRIES:
                raise
            wait = min(RETRY_WAIT_S * 2**attempt, 60)
            print(f"{e} (trying again in {wait:g} s, {RETRIES - attempt} tries left)", file=sys.stderr)
            time.sleep(wait)
            have = part.stat().st_size if part.is_file() else 0  # the bar has counted these already
    got = part.stat().st_size
    if got != size:  # more than the listing says (without a Content-Length to tell us before)
        part.unlink()
        raise UserError(f"{url} sent {got:,} bytes, the listing says {size:,}: refused")
    if sha256 is not None:
        digest = sha256_of(part)
        if digest != sha256:
            part.unlink()
            raise UserError(
                f"{url} arrived damaged (sha256 {digest[:16]}..., published {sha256[:16]}...): removed, run again"
            )
    checked.unlink(missing_ok=True)
    os.replace(part, dest)
    if sha256 is not None:
        checked.write_text(sha256 + "\n")
    return dest


class Stopped(UserError):
    """A download that stopped on the way (a lost connection, a timeout, a server's
    passing error): what arrived is kept and fetch tries again from there."""


def _download(url, part, have, size, bar):
    """Append url's bytes from `have` on to part (or rewrite it when the server sends all)."""
    request = urllib.request.Request(url)
    if have:
        request.add_header("Range", f"bytes={have}-")
    try:
        response = urllib.request.urlopen(request, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # the range starts past the file's end: the .part is not a prefix of it
            part.unlink()
            raise UserError(f"{url} is shorter than the {have:,} bytes already downloaded: removed, run again")
        kind = Stopped if e.code == 429 or e.code >= 500 else UserError  # busy or failing, not "no such file"
        raise kind(f"could not download {url} ({_why(e)})")
    except (OSError, http.client.HTTPException) as e:
        raise Stopped(f"could not download {url} ({_why(e)}): run again to continue where it stopped")
    with response:
        resumed = bool(have) and response.status == 206  # 200: the server sent it all, from byte 0
        start = have if resumed else 0
        length = response.headers.get("Content-Length", "")
        if length.isdigit() and start + int(length) != size:
            part.unlink(missing_ok=True)
            raise UserError(f"{url} has {start + int(length):,} bytes, the listing says {size:,}: refused")
        if bar is not None and have and not resumed:
            bar.update(-have)
        written = start
        with open(part, "ab" if resumed else "wb") as f:
            while True:
                try:
                    block = response.read1(BLOCK)  # what has arrived, up to BLOCK: a kill loses little
                except (OSError, http.client.HTTPException) as e:  # a reset, a timeout, a cut: what arrived is kept
                    raise Stopped(f"the download of {url} stopped ({_why(e)}): run again to continue where it stopped")
                if not block:
                    break
                try:
                    f.write(block)
                except OSError as e:  # a full disk: no retry helps
                    raise UserError(f"cannot write {part}: {e.strerror or e}")
                written += len(block)
                if bar is not None:
                    bar.update(len(block))
    if written < size:
        raise Stopped(
            f"the download of {url} stopped at {written:,} of {size:,} bytes: run again to continue where it stopped"
        )
