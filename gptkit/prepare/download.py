"""Downloading a published corpus's files from a Hugging Face dataset repository.

    list_files(base, repo, revision, folder)   the files below `folder`, with the size and
                                               sha256 the Hub's tree API gives for each
    fetch(url, dest, size, sha256, bar)        one file, resumable and checked
    fetch_whole(url, dest, cap, what, hint)    one file of unlisted size, in one go, at most `cap`
                                               bytes: every other download of the project
                                               (GPT-2's weights, eval tasks, GSM8K, Tiny Shakespeare)

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

The server is not trusted: every field of the listing is checked (a name that is one
file in the folder, a size that is a whole number of bytes), reads stop at the listed
size + 1 byte (a whole listing at LISTING_BYTES), only http(s) addresses are opened
(a Link or a redirect to file:, ftp: or data: is refused), a paged listing may not
loop or run past MAX_PAGES, and a 206's Content-Range must start where we asked
before its bytes are appended. Each refusal is one line naming what the server did.

fetch_whole keeps the same promises for a file nobody lists: http(s) only, redirects
included; at most `cap` bytes (a Content-Length past it is refused before a byte is
read); a body shorter than its Content-Length, a 5xx, a stall or a trickle is refused;
the bytes go to a temporary file renamed into place only when whole.

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
import unicodedata
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from gptkit.ops.atomic import atomic_write
from gptkit.ops.errors import UserError

BLOCK = 1 << 20
TIMEOUT_S = 60
RETRIES = 4  # a stopped download is continued this many times before giving up (waits 2, 4, 8, 16 s)
RETRY_WAIT_S = 2
# What a server may send, whatever it says: bounds that end a loop or an endless body in one line.
LISTING_BYTES = 64 << 20  # a whole listing, all pages (~250 bytes a file: room for ~250,000 files)
MAX_PAGES = 10_000  # pages of one listing
READ_TIME_S = 600  # to send one page of a listing, however slowly it trickles in; and for a file
SLOWEST_BYTES = 1 << 20  # ... to send at least this much more of it (1.7 KB/s), else it is continued later
MAX_FILE_BYTES = 1 << 40  # a listed size past 1 TiB is no corpus shard's
NAME_BYTES = 255 - len(".sha256")  # file systems hold 255 bytes a name; ours add .part and .sha256


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
    """A network error in a few words, on one line: 'HTTP 404 Not Found', 'Connection refused'
    (urllib's own reasons can span lines, a server's reason phrase can be long)."""
    if isinstance(e, urllib.error.HTTPError):
        why = f"HTTP {e.code} {e.reason}"
    elif isinstance(e, http.client.IncompleteRead):
        why = f"connection closed after {len(e.partial):,} more bytes"
    else:
        reason = getattr(e, "reason", None) or e
        why = str(getattr(reason, "strerror", None) or reason or type(e).__name__)
    return " ".join(why.split())[:200]


def list_files(base, repo, revision, folder, suffix=".parquet"):
    """The RemoteFiles directly in `folder` whose names end in `suffix`, sorted by path.
    The Hub pages a long listing behind `Link: <URL>; rel="next"`: followed to http(s)
    addresses only, each page once, at most MAX_PAGES of them."""
    first = tree_url(base, repo, revision, folder)
    url, files, seen, budget = web_address(first, "--base_url"), {}, set(), LISTING_BYTES
    while url:
        if url in seen:
            raise UserError(f"the listing at {first} leads back to a page it has listed ({url}): refused")
        if len(seen) == MAX_PAGES:
            raise UserError(f"the listing at {first} goes on past {MAX_PAGES:,} pages: refused")
        seen.add(url)
        entries, link, size = listing_page(url, repo, folder, budget)
        budget -= size
        for f in (f for entry in entries if (f := listed_file(entry, folder, suffix, url))):
            if f.path in files:
                raise UserError(f"the listing at {first} lists {f.path} twice (at {url}): refused")
            files[f.path] = f
        page, url = url, next_page(link, url)
        if url and not entries:  # a new address each time, never an end
            raise UserError(f"{page} is an empty page of the listing at {first} that points to a next one: refused")
    if not files:
        raise UserError(f"{first} lists no {suffix} files")
    return sorted(files.values(), key=lambda f: f.path)


def web_address(url, named):
    """`url` when it is an http(s) address: no other scheme (file:, ftp:, data:) is opened."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # an IPv6 host without its closing bracket
        parts = None
    if parts is None or parts.scheme.lower() not in ("http", "https") or not parts.netloc:
        raise UserError(f"{named} is {url[:200]!r}, not an http(s) address: refused")
    if any(c.isspace() or unicodedata.category(c) == "Cc" for c in url):  # a folded header's line break
        raise UserError(f"{named} is {url[:200]!r}, which holds spaces or control characters: refused")
    return url


def next_page(link, url):
    """The address a Link header's rel="next" names (relative to `url`), or None."""
    match = re.search(r'<([^>]*)>\s*;\s*rel="?next\b', link)
    if match is None:
        return None
    try:
        target = urllib.parse.urljoin(url, match.group(1).strip())
    except ValueError:  # an IPv6 host without its closing bracket
        target = match.group(1)
    return web_address(target, f"the next page after {url}")


def listing_page(url, repo, folder, budget):
    """One page of the listing: (its entries, its Link header, its size), read up to `budget` bytes."""
    try:
        with _open(url) as response:
            body = read_capped(response, url, budget, f"{url} takes the listing past {LISTING_BYTES:,} bytes "
                               "(all pages together): refused")
            link = response.headers.get("Link", "")
    except (OSError, ValueError, http.client.HTTPException) as e:  # URLError, timeouts, a URL http.client refuses
        raise UserError(
            f"could not list {repo}/{folder} at {url} ({_why(e)}): offline, or a mirror? set --base_url "
            "or HF_ENDPOINT to one that serves the Hub's routes"
        )
    try:
        entries = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past Python's stack
        entries = None
    if not isinstance(entries, list):
        raise UserError(f"{url} did not answer with the Hub's file listing (a JSON list): {body[:80]!r}")
    return entries, link, len(body)


def read_capped(response, url, cap, refusal):
    """The whole body of `response`; UserError(`refusal`) past `cap` bytes, and past READ_TIME_S seconds."""
    length = response.headers.get("Content-Length", "")
    if length.isdecimal() and int(length) > cap:
        raise UserError(refusal)
    _check_encoding(response, url)
    body, deadline = bytearray(), time.monotonic() + READ_TIME_S
    while block := response.read1(BLOCK):
        body += block
        if len(body) > cap:
            raise UserError(refusal)
        if time.monotonic() > deadline:
            raise UserError(f"{url} took more than {READ_TIME_S} s to answer: refused")
    return bytes(body)


def _check_encoding(response, url):
    """We ask for no compression: a compressed body is not the file's bytes."""
    encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise UserError(f"{url} answered with Content-Encoding {encoding[:40]!r}, not the file's own bytes: refused")


def listed_file(entry, folder, suffix, url):
    """A RemoteFile for one entry of the listing (None for a folder or another kind of
    file). Every field is checked: its name becomes a file on this disk, its size the
    bound of every read."""
    if not isinstance(entry, dict):
        raise UserError(f"{url} answered with a listing entry that is not the Hub's: {_shown(entry)}")
    path = entry.get("path")
    if entry.get("type") != "file":
        return None
    if not isinstance(path, str):
        raise UserError(f"{url} answered with a listing entry that is not the Hub's: {_shown(entry)}")
    if not path.endswith(suffix):
        return None
    check_name(path, folder, url)
    size, lfs = entry.get("size"), entry.get("lfs") or {}
    if type(size) is not int or not 0 <= size <= MAX_FILE_BYTES:  # not bool, float (inf, nan), str
        raise UserError(f"{url} lists {path} with a size of {_shown(size)}: not a whole number of bytes "
                        f"from 0 to {MAX_FILE_BYTES:,}: refused")
    sha256 = lfs.get("oid") if isinstance(lfs, dict) else lfs
    if not isinstance(lfs, dict) or (sha256 is not None and not re.fullmatch(r"[0-9a-f]{64}", str(sha256))):
        raise UserError(f"{url} lists {path} with a sha256 that cannot be right: {_shown(sha256)}")
    if lfs.get("size", size) != size:
        raise UserError(f"{url} lists {path} with two sizes ({size:,} and {_shown(lfs['size'])}): refused")
    return RemoteFile(path, size, sha256)


def check_name(path, folder, url):
    """A listed path must name one file directly in `folder` (the Hub's listing is not
    recursive) by a name this disk can hold: no control characters (NUL among them), no
    separators, no '..', at most NAME_BYTES bytes of UTF-8."""
    if any(unicodedata.category(c) == "Cc" for c in path):
        raise UserError(f"{url} lists a file name with control characters: {path[:200]!r}: refused")
    prefix = folder.rstrip("/") + "/"
    name = path[len(prefix):] if path.startswith(prefix) else ""
    if name in ("", ".", "..") or "/" in name or "\\" in name:
        raise UserError(f"{url} lists a file outside {folder}: {path[:200]!r}")
    try:
        length = len(name.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate, which JSON's \ud800 can spell
        raise UserError(f"{url} lists a file name that is not valid Unicode: {path[:200]!r}: refused") from None
    if length > NAME_BYTES:
        raise UserError(f"{url} lists a file name of {length:,} bytes (at most {NAME_BYTES}): {path[:80]!r}...")


def _shown(value):
    return repr(value)[:120]


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
        recorded = checked.read_text(errors="replace").strip() if checked.is_file() else sha256_of(dest)
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


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect to another http(s) address only (urllib's own also follows ftp:)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        web_address(newurl, f"the redirect from {req.full_url}")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _open(request):
    return urllib.request.build_opener(_Redirects).open(request, timeout=TIMEOUT_S)


def _download(url, part, have, size, bar):
    """Append url's bytes from `have` on to part (or rewrite it when the server sends all),
    reading no more than the listed `size`: a longer body is refused at its size+1st byte."""
    request = urllib.request.Request(web_address(url, "a file's address"))
    if have:
        request.add_header("Range", f"bytes={have}-")
    try:
        response = _open(request)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # "past the end": yet the listing says the file is longer than the .part
            raise UserError(f"{url} answered 416 to a request from byte {have:,} of a file listed at {size:,} "
                            f"bytes: refused (remove {part} to download it again)")
        kind = Stopped if e.code == 429 or e.code >= 500 else UserError  # busy or failing, not "no such file"
        raise kind(f"could not download {url} ({_why(e)})")
    except (OSError, http.client.HTTPException) as e:
        raise Stopped(f"could not download {url} ({_why(e)}): run again to continue where it stopped")
    except ValueError as e:  # a URL http.client refuses (control characters)
        raise UserError(f"could not download {url} ({e})")
    with response:
        start = first_byte(response, url, have, size)  # 0: the server sent it all, from byte 0
        length = response.headers.get("Content-Length", "")
        if length.isdecimal() and start + int(length) != size:
            raise UserError(f"{url} has {start + int(length):,} bytes, the listing says {size:,}: refused")
        _check_encoding(response, url)
        if bar is not None and have and not start:
            bar.update(-have)
        written, too_long = start, False
        window = (time.monotonic(), written)  # a trickle that never times out is a hang, too
        with open(part, "ab" if start else "wb") as f:
            while True:
                if time.monotonic() - window[0] > READ_TIME_S:
                    if written - window[1] < SLOWEST_BYTES:
                        raise Stopped(f"the download of {url} brought {written - window[1]:,} bytes in the last "
                                      f"{READ_TIME_S} s: too slow, run again to continue where it stopped")
                    window = (time.monotonic(), written)
                try:
                    block = response.read1(min(BLOCK, size + 1 - written))  # what has arrived: a kill loses little
                except (OSError, http.client.HTTPException) as e:  # a reset, a timeout, a cut: what arrived is kept
                    raise Stopped(f"the download of {url} stopped ({_why(e)}): run again to continue where it stopped")
                if not block:
                    break
                if written + len(block) > size:  # the listed size + 1: what this answer added is dropped
                    f.truncate(start)
                    too_long = True
                    break
                try:
                    f.write(block)
                except OSError as e:  # a full disk: no retry helps
                    raise UserError(f"cannot write {part}: {e.strerror or e}")
                written += len(block)
                if bar is not None:
                    bar.update(len(block))
    if too_long:
        if not start:
            part.unlink()
        raise UserError(f"{url} sent more than the {size:,} bytes the listing says: refused")
    if written < size:
        raise Stopped(
            f"the download of {url} stopped at {written:,} of {size:,} bytes: run again to continue where it stopped"
        )


def first_byte(response, url, have, size):
    """Where the response's body starts in the file: 0 for a 200 (all of it), `have` for a
    206 whose Content-Range says it starts there (and ends at the listed size). Anything else
    is refused before a byte is appended: a spliced file could pass as finished."""
    if response.status == 200:
        return 0
    if response.status != 206:
        raise UserError(f"{url} answered HTTP {response.status} {_why(response.reason)[:80]}, not the file: refused")
    told = response.headers.get("Content-Range", "")
    match = re.fullmatch(r"bytes ([0-9]+)-([0-9]+)/([0-9]+|\*)", told.strip())
    if match is None:
        raise UserError(f"{url} sent part of the file without a Content-Range that says which: {told[:80]!r}")
    first, last, total = match.groups()
    if int(first) != have:
        raise UserError(f"{url} sent the file from byte {int(first):,} when asked from byte {have:,}: refused")
    if total != "*" and int(total) != size:
        raise UserError(f"{url} says the file has {int(total):,} bytes, the listing says {size:,}: refused")
    if int(last) != size - 1:
        raise UserError(f"{url} sent bytes {first}-{last} of a file of {size:,} (listed): refused")
    return have


def fetch_whole(url, dest, cap, what, hint="", sha256=None):
    """Download url to dest, reading at most `cap` bytes: the bound for a file no listing
    sizes (a stated cap per kind of file, or its known size), and check its sha256 when
    one is known. No resume: the files this serves are small, or fetched once. Every
    failure is one line, "could not download WHAT from URL (WHY)" + hint, and leaves
    nothing at dest (gptkit/ops/atomic.py). Returns dest."""
    try:
        with atomic_write(dest) as tmp:
            _fetch_capped(web_address(url, "the address"), tmp, cap)
            digest = sha256_of(tmp) if sha256 else None
            if digest != sha256:
                raise UserError(f"it has sha256 {digest}, expected {sha256}")
    except UserError as e:
        raise UserError(f"could not download {what} from {url} ({e}){hint}") from None
    return dest


def _fetch_capped(url, tmp, cap):
    """url's body into tmp, refused (UserError, its reason) past `cap` bytes, short of its
    Content-Length, or arriving slower than SLOWEST_BYTES per READ_TIME_S."""
    try:
        response = _open(urllib.request.Request(url))
    except (OSError, http.client.HTTPException) as e:  # HTTPError (404, 5xx), URLError, timeouts
        raise UserError(_why(e)) from None
    except ValueError as e:  # a URL http.client refuses (control characters)
        raise UserError(" ".join(str(e).split())[:200]) from None
    with response, open(tmp, "wb") as f:
        length = response.headers.get("Content-Length", "")
        if length.isdecimal() and int(length) > cap:
            raise UserError(f"it has {int(length):,} bytes, more than the {cap:,} allowed: refused")
        if response.status != 200:
            raise UserError(f"HTTP {response.status} {_why(response.reason)[:80]}, not the file: refused")
        _check_encoding(response, url)
        written, window = 0, (time.monotonic(), 0)
        while True:
            if time.monotonic() - window[0] > READ_TIME_S:
                if written - window[1] < SLOWEST_BYTES:
                    raise UserError(f"{written - window[1]:,} bytes in the last {READ_TIME_S} s: too slow")
                window = (time.monotonic(), written)
            try:
                block = response.read1(min(BLOCK, cap + 1 - written))
            except (OSError, http.client.HTTPException) as e:  # a reset, a timeout, a cut chunked body
                raise UserError(f"stopped after {written:,} bytes: {_why(e)}") from None
            if not block:
                break
            written += len(block)
            if written > cap:
                raise UserError(f"it sent more than the {cap:,} bytes allowed: refused")
            f.write(block)
    if length.isdecimal() and written != int(length):
        raise UserError(f"the connection closed after {written:,} of its {int(length):,} bytes")
