"""serve.py's set-up: the listening socket, the key, the warning, the worker and the
app, then the server until a signal (gptkit/serve/app.py runs it)."""

import dataclasses
import ipaddress
import os
import socket
import sys
import time

from gptkit.data.chat import chat_vocabulary
from gptkit.ops.errors import UserError
from gptkit.serve.guard import LISTEN_BACKLOG

API_KEY_VARIABLE = "GPTKIT_API_KEY"


@dataclasses.dataclass
class State:
    """What the routes read: the settings, the worker and the model's facts."""

    cfg: object
    worker: object
    tokenizer: object
    model_name: str
    chat: dict | None
    block_size: int
    max_tokens: int
    api_key: str | None
    created: int
    host_names: set | None  # the Host header's names served (None: any)
    mailboxes: object  # app.Mailboxes: the worker's events, handed to each event loop after a step


def is_loopback(host):
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host, port):
    """A listening socket on host:port (port 0: a free one), or a UserError naming why not."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise UserError(f"cannot listen on host {host!r}: {e.strerror}")
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(LISTEN_BACKLOG)
    except OSError as e:
        sock.close()
        hint = ": another server is using it; pick another --port" if e.errno == 98 else ""
        raise UserError(f"cannot listen on {host}:{port} ({e.strerror}){hint}")
    sock.set_inheritable(True)
    return sock


def exposure_warning(host, key):
    """The one line printed when others can reach the server and no key is asked for, else None."""
    if is_loopback(host) or key is not None:
        return None
    return (f"warning: serving on {host} without an API key: anyone who can reach it can use this model "
            f"(set {API_KEY_VARIABLE} or --api_key)")


def api_key(cfg):
    """The key every request but /health and the page must carry: --api_key, else $GPTKIT_API_KEY;
    a UserError for one no client could send in an HTTP header."""
    where = "--api_key" if cfg.api_key is not None else API_KEY_VARIABLE
    key = cfg.api_key if cfg.api_key is not None else os.environ.get(API_KEY_VARIABLE)
    if key is None or (key == "" and where == API_KEY_VARIABLE):
        return None  # an empty variable: no key, as if unset
    problem = ("is empty" if key == "" else
               "starts or ends with white space" if key != key.strip() else
               "has characters outside printable ASCII" if not (key.isascii() and key.isprintable()) else None)
    if problem:
        raise UserError(f"the API key ({where}) {problem}: an HTTP header cannot carry it as it is, so no client "
                        "could send it; use letters, digits and punctuation")
    return key


def batch_size_that_runs(model, device, max_batch, header):
    """(header, max_batch): max_batch where model.py's forward runs replies of different
    lengths together as it runs each alone (gptkit/serve/batch.py's batching_differs);
    else 1, the header saying why in one more line. UserError if even one row fails, or
    if the forward through a KV cache is not the forward over the whole context."""
    from gptkit.fast import cpu_linears
    from gptkit.generation.generate import cache_differs
    from gptkit.serve.batch import batching_differs

    why = cache_differs(model, note=None)
    if why:
        raise UserError(f"serve.py cannot run this model.py: its replies run through the KV cache, and model.py's "
                        f"forward through its cache is not its forward over the whole context ({why})")
    with cpu_linears.as_written(model):  # model.py's forward, not the CPU parts' rounding (checked when swapped)
        why = batching_differs(model, device, rows=3 if max_batch > 1 else 1)  # ~1 CPU s for GPT-2 124M
        alone = batching_differs(model, device, rows=1) if why and max_batch > 1 else why
    if why is None:
        return header, max_batch
    if alone:
        raise UserError(f"serve.py cannot run this model.py: its forward fails with a BatchKVCache, whose "
                        f"positions are a tensor per row ({alone})")
    return (f"{header}\ndecode: replies run one at a time (--max_batch 1): model.py's forward does not batch "
            f"replies of different lengths as written ({why})"), 1


def serve(model, tokenizer, summary, cfg, device, model_name, sock):
    """Run the server on the listening socket `sock` (from bind) until SIGINT or SIGTERM; 0 then."""
    from gptkit.generation.generate import prepare_for_generating
    from gptkit.serve.app import Mailboxes, build_app, run_server
    from gptkit.serve.guard import allowed_host_names, parse_allowed_hosts
    from gptkit.serve.worker import Worker

    key = api_key(cfg)
    block = model.config.block_size
    max_tokens = block if cfg.max_tokens is None else cfg.max_tokens
    chat = chat_vocabulary(model.config.vocab_size, tokenizer.vocab_size)
    path = prepare_for_generating(model, cfg.dtype, device, cfg.cpu_decode)  # weights' dtype, CPU's parts
    path, max_batch = batch_size_that_runs(model, device, cfg.max_batch, path)
    mailboxes = Mailboxes(cfg.stream_interval)  # a step's later tokens may wait for the next write's interval
    worker = Worker(model, tokenizer, device, cfg.queue_size, max_batch, around_step=mailboxes.step,
                    tools=cfg.tools)
    host_names = allowed_host_names(cfg.host, parse_allowed_hosts(cfg.allowed_hosts))
    state = State(cfg, worker, tokenizer, model_name, chat, block, max_tokens, key, int(time.time()), host_names,
                  mailboxes)
    app = build_app(state)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"{summary}\n{path}", file=sys.stderr)
    warning = exposure_warning(cfg.host, key)
    if warning:
        print(warning, file=sys.stderr)

    def ready(server):
        kind = "chat model" if chat else "not a chat model: /v1/completions only"
        print(f"serving {model_name} ({kind}) at http://{shown}:{port}/ (chat page; OpenAI API at /v1); "
              "Ctrl-C stops", file=sys.stderr, flush=True)

    worker.start()
    try:
        run_server(app, state, sock, on_ready=ready)
    finally:
        worker.stop()
        worker.join(timeout=10)
        sock.close()
    print("stopped", file=sys.stderr)
    return 0
