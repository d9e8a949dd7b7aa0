"""A stand-in for the Hugging Face Hub on 127.0.0.1, for the download tests.

It serves the two routes prepare.py uses, as the Hub answers them:
    GET /api/datasets/REPO/tree/REVISION/FOLDER   JSON list: type, oid, size, path, lfs {oid, size, pointerSize}
    GET /datasets/REPO/resolve/REVISION/PATH      the file, with Range (206 + Content-Range)
and Parquet shards written in the publishers' own schemas (FineWeb-Edu's columns,
OpenWebText's parquet conversion's single `text` column). Faults are switches on
the server: `cut_once` (send N bytes of a file, then drop the connection), `corrupt`
(flip a byte, same size), `missing` (404), `ignore_range` (answer 200 with it all).
Hostile switches, for a server that lies: `link` (the Link header of each listing
page), `listing_body` (bytes, or ENDLESS), `redirect_to` (to any address, any scheme),
`overlong` (files that go on past their size, with no Content-Length), `range_shift`
and `content_range` (a 206 from another offset, or with a Content-Range of our own).
"""

import hashlib
import json
import random
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pyarrow as pa
import pyarrow.parquet as pq

ENDLESS = "endless"  # a body that never ends, until the client hangs up
WORDS = "the of and a to in is was for on that with as by it he at from his an were are which this".split()
WORDS += ["educational", "résumé", "naïve", "日本語", "x,y", "3.14", "don't", "\n\n", "\n"]


def random_texts(n, seed):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 300))) for _ in range(n)]


def fineweb_edu_table(texts, shard):
    """FineWeb-Edu's columns and types (datatrove's Parquet writer)."""
    n = len(texts)
    return pa.table({
        "text": pa.array(texts, pa.string()),
        "id": pa.array([f"<urn:uuid:{shard:04d}-{i:08d}>" for i in range(n)], pa.string()),
        "dump": pa.array(["CC-MAIN-2013-20"] * n, pa.string()),
        "url": pa.array([f"http://example.com/{shard}/{i}" for i in range(n)], pa.string()),
        "file_path": pa.array(["s3://commoncrawl/crawl-data/x.warc.gz"] * n, pa.string()),
        "language": pa.array(["en"] * n, pa.string()),
        "language_score": pa.array([0.97] * n, pa.float64()),
        "token_count": pa.array([len(t) // 4 for t in texts], pa.int64()),
        "score": pa.array([3.1] * n, pa.float64()),
        "int_score": pa.array([3] * n, pa.int64()),
    })


def openwebtext_table(texts, shard):
    """The Hub's parquet conversion of Skylion007/openwebtext: one string column, text."""
    return pa.table({"text": pa.array(texts, pa.string())})


class FakeHub:
    def __init__(self, root):
        self.root = root  # files under root/REPO/REVISION/PATH
        self.requests = []  # (path, Range header or None)
        self.cut_once = {}  # repo path -> bytes to send before dropping the connection (once)
        self.corrupt = set()
        self.missing = set()
        self.status_once = {}  # repo path -> an HTTP error status to answer once (503: busy)
        self.ignore_range = False
        self.lie_size = {}  # repo path -> size the listing claims
        self.slow = None  # (bytes, seconds): send files in pieces of `bytes` with a pause between
        self.extra_entries = []  # listing entries added as they are (a hostile or broken listing)
        self.redirect = False  # answer resolve with 302 to /cdn/..., as the Hub sends LFS files to its CDN
        self.page_size = 1000  # entries per listing page; the rest behind a Link: rel="next" cursor
        self.link = None  # cursor -> the Link header value for that page (None: the honest one)
        self.listing_body = None  # bytes (or ENDLESS) to answer every listing page with instead
        self.redirect_to = None  # (path prefix, address): requests under the prefix get a 302 there
        self.lfs = True  # False: files listed without lfs (no published sha256), as small files are
        self.overlong = set()  # repo paths whose body goes on past their size (endless zeros)
        self.range_shift = 0  # answer a Range request from this many bytes further on (and say so)
        self.content_range = None  # a Content-Range header sent with every 206 instead of the true one
        self.encoding = None  # a Content-Encoding header sent with every file

    def add(self, repo, revision, path, table, row_group_size=64):
        dest = self.root / repo / revision / path
        dest.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, dest, row_group_size=row_group_size)
        return dest

    def file(self, repo, revision, path):
        return self.root / repo / revision / path

    def start(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
                hub.requests.append((path, self.headers.get("Range")))
                if hub.redirect_to is not None and path.startswith(hub.redirect_to[0]):
                    self.send_response(302)
                    self.send_header("Location", hub.redirect_to[1])
                    self.send_header("Content-Length", "0")
                    return self.end_headers()
                if path.startswith("/api/datasets/"):
                    return self.tree(path.removeprefix("/api/datasets/"))
                if path.startswith("/datasets/") and hub.redirect:
                    self.send_response(302)
                    self.send_header("Location", f"{hub.url}/cdn/{path.removeprefix('/datasets/')}")
                    self.send_header("Content-Length", "0")
                    return self.end_headers()
                if path.startswith("/datasets/"):
                    return self.resolve(path.removeprefix("/datasets/"))
                if path.startswith("/cdn/"):
                    return self.resolve(path.removeprefix("/cdn/"))
                self.send_error(404)

            def split(self, rest, verb):
                owner, name, kind, tail = rest.split("/", 3)
                assert kind == verb, rest
                for revision in ("refs/convert/parquet", "main"):
                    if tail.startswith(revision + "/"):
                        return f"{owner}/{name}", revision, tail[len(revision) + 1 :]
                return f"{owner}/{name}", None, tail

            def tree(self, rest):
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                cursor = int(query.get("cursor", ["0"])[0])
                repo, revision, folder = self.split(rest, "tree")
                base = hub.root / repo / str(revision) / folder
                if revision is None or not base.is_dir():
                    return self.send_error(404)
                entries = []
                for f in sorted(base.iterdir()):
                    data = f.read_bytes()
                    rel = f"{folder}/{f.name}"
                    size = hub.lie_size.get(rel, len(data))
                    entries.append({
                        "type": "file", "oid": hashlib.sha1(data).hexdigest(), "size": size, "path": rel,
                        "lfs": {"oid": hashlib.sha256(data).hexdigest(), "size": size, "pointerSize": 134},
                    })
                    if not hub.lfs:
                        del entries[-1]["lfs"]
                entries += hub.extra_entries
                page = entries[cursor : cursor + hub.page_size]
                body = json.dumps(page).encode() if hub.listing_body is None else hub.listing_body
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                if hub.link is not None:
                    if hub.link(cursor) is not None:
                        self.send_header("Link", hub.link(cursor))
                elif cursor + hub.page_size < len(entries):
                    here = urllib.parse.urlsplit(self.path).path
                    self.send_header("Link", f'<{hub.url}{here}?cursor={cursor + hub.page_size}>; rel="next"')
                if body == ENDLESS:
                    self.end_headers()
                    return self.endless(b"[" + b'{"type": "directory", "path": "x"}, ' * 1000)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def endless(self, piece):
                """`piece` over and over, until the client hangs up (or 4 GB: a test gone wrong)."""
                self.close_connection = True
                try:
                    for _ in range((4 << 30) // len(piece)):
                        self.wfile.write(piece)
                except OSError:
                    pass

            def resolve(self, rest):
                repo, revision, path = self.split(rest, "resolve")
                f = hub.root / repo / str(revision) / path
                if revision is None or path in hub.missing or not f.is_file():
                    return self.send_error(404, "Entry Not Found")
                if path in hub.status_once:
                    return self.send_error(hub.status_once.pop(path))
                data = f.read_bytes()
                if path in hub.corrupt:
                    data = data[:100] + bytes([data[100] ^ 0xFF]) + data[101:]
                start = 0
                wanted = self.headers.get("Range")
                if wanted and not hub.ignore_range:
                    start = int(wanted.removeprefix("bytes=").split("-")[0]) + hub.range_shift
                    if start >= len(data):
                        return self.send_error(416)
                    self.send_response(206)
                    told = f"bytes {start}-{len(data) - 1}/{len(data)}"
                    self.send_header("Content-Range", told if hub.content_range is None else hub.content_range)
                else:
                    self.send_response(200)
                if hub.encoding is not None:
                    self.send_header("Content-Encoding", hub.encoding)
                if path in hub.overlong:
                    self.end_headers()
                    self.wfile.write(data[start:])
                    return self.endless(bytes(1 << 16))
                self.send_header("Content-Length", str(len(data) - start))
                self.send_header("Accept-Ranges", "bytes")
                self.end_headers()
                cut = hub.cut_once.pop(path, None)
                if cut is not None:
                    self.wfile.write(data[start : start + cut])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                if hub.slow is None:
                    self.wfile.write(data[start:])
                    return
                piece, pause = hub.slow
                for at in range(start, len(data), piece):
                    try:
                        self.wfile.write(data[at : at + piece])
                        self.wfile.flush()
                    except OSError:  # the client is gone (killed)
                        return
                    time.sleep(pause)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()  # quick stop
        return self

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
