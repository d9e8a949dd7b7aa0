"""The clients of bench.py serve: STREAMS clients at once, each sending streamed chat
requests one after another (the next as its last reply ends, so the server holds STREAMS
requests at a time, as vLLM's benchmark_serving.py --max-concurrency and the virtual
users of llama.cpp's server benchmark do) until SECONDS have passed (0: one request
each), from one asyncio event loop in a process of its own.

    python -m benchmarks.serve_clients PORT STREAMS SECONDS NEW_TOKENS [SERVER_PID]   # prints one JSON line

Each request is HTTP/1.1 over a plain socket (POST, the reply read as it comes,
chunked or not); every server-sent event is parsed with json.loads. Per request: the
seconds to its first chunk with content (TTFT), its completion tokens (the usage
chunk's count, else the content chunks), its seconds in all. One loop in one thread
spends less CPU per chunk than a thread per client (each chunk would hand Python's
lock between threads), and this process is not the server's: on a machine of two
vCPUs the clients' share of the CPU is part of every figure, the same for every server
measured.
"""

import asyncio
import json
import os
import sys
import time
from pathlib import Path


def request_bytes(port, content, new_tokens):
    body = json.dumps({"model": "bench", "messages": [{"role": "user", "content": content}], "temperature": 0,
                       "max_tokens": new_tokens, "stream": True, "stream_options": {"include_usage": True},
                       "repeat_penalty": 1.0}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode() + body


async def body_pieces(reader, headers):
    """The reply's body as it arrives: chunked transfer coding decoded, else read to the end."""
    if headers.get("transfer-encoding", "").lower() != "chunked":
        while piece := await reader.read(65536):
            yield piece
        return
    while True:
        size = int((await reader.readline()).split(b";")[0], 16)
        if size == 0:
            return
        yield await reader.readexactly(size)
        await reader.readexactly(2)  # the CRLF after each chunk


async def one_stream(port, content, new_tokens):
    """(seconds to the first content chunk, tokens generated, seconds in all) of one streamed reply."""
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    first, pieces, tokens, pending = None, 0, None, b""
    try:
        writer.write(request_bytes(port, content, new_tokens))
        status = (await reader.readline()).split()
        if len(status) < 2 or status[1] != b"200":
            raise RuntimeError(f"the server answered {b' '.join(status).decode()!r}")
        headers = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        async for piece in body_pieces(reader, headers):
            *events, pending = (pending + piece).split(b"\n\n")
            for event in events:
                for line in event.splitlines():
                    if not line.startswith(b"data: ") or line == b"data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):
                        tokens = chunk["usage"]["completion_tokens"]
                    for choice in chunk.get("choices") or []:
                        if (choice.get("delta") or {}).get("content"):
                            pieces += 1
                            first = first or time.perf_counter() - t0
    finally:
        writer.close()
    return first or float("nan"), tokens if tokens is not None else pieces, time.perf_counter() - t0


async def client(port, i, new_tokens, until):
    """Client i's requests, one after another until time.perf_counter() passes `until`:
    [(TTFT, tokens, seconds)]."""
    results = []
    while not results or time.perf_counter() < until:
        results.append(await one_stream(port, f"What is {i + 7 * len(results)}+{i + 1}?", new_tokens))
    return results


async def load(port, streams, seconds, new_tokens):
    """[(TTFT, tokens, seconds)] per request, and the wall seconds from the first request to the last reply."""
    t0 = time.perf_counter()
    results = await asyncio.gather(*(client(port, i, new_tokens, t0 + seconds) for i in range(streams)))
    return [r for rs in results for r in rs], time.perf_counter() - t0


def cpu_seconds(pid):
    """User + system CPU seconds of process `pid` so far (Linux's /proc), or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


if __name__ == "__main__":
    port, streams, seconds, new_tokens, *pid = (float(a) if i == 2 else int(a) for i, a in enumerate(sys.argv[1:]))
    asyncio.run(one_stream(port, "What is 1+2?", 4))  # a warm-up reply
    cpu0 = cpu_seconds(pid[0]) if pid else None
    results, wall = asyncio.run(load(port, streams, seconds, new_tokens))
    cpu1 = cpu_seconds(pid[0]) if pid else None
    cpu = None if cpu0 is None or cpu1 is None else cpu1 - cpu0  # the server's CPU seconds during the load
    print(json.dumps({"results": results, "wall": wall, "server_cpu": cpu}))
