"""serve.py under load: time to first token and tokens/s for 1, 4 and 16 concurrent streams.

    python bench.py serve                   # the quick-start chat model and a GPT-2-shaped one, vs llama-cpp-python
    python bench.py serve --quick           # a smoke test: a tiny model, 1 and 2 streams, a few tokens
    python bench.py serve --no_llama_cpp    # serve.py alone
    python bench.py serve --models chat     # the chat recipe's model only (gpt2: GPT-2's shape only)

Two models: the chat model of configs/chat_arithmetic.py (out-chat-arithmetic's
checkpoint when there is one, else its shape with random weights) and GPT-2 124M's
shape (12x12x768, GPT-2 BPE and the turn tokens; random weights). Random weights have
their turn tokens' rows zeroed, so greedy replies never end early and every stream
generates --new_tokens. Each is served by serve.py in a subprocess (CPU, float32:
model.py's forward, batched), then by llama-cpp-python's own OpenAI server on our
`convert.py --to gguf` export of the same weights where llama-cpp-python[server] is
installed and the architecture exports (the chat_arithmetic shape's ReLU² does not).
For each concurrency, that many clients start at once, each sending streaming
/v1/chat/completions requests in turn (greedy, max_tokens --new_tokens; the next as
its last reply ends, so the server holds that many requests throughout) until
--seconds have passed, from benchmarks/serve_clients.py: one asyncio loop in a process
of its own (as vLLM's benchmark_serving.py --max-concurrency). Every concurrency is
loaded for the same time, so one stream's rate is not a shorter, luckier sample. Per request the seconds
to its first content chunk (TTFT), and over the load the generated tokens (the
replies' usage) per wall second.
serve.py batches requests continuously (gptkit/serve/batch.py: every running reply
advances one token a step, through model.py's forward and BatchKVCache), so the total
rate grows with the streams; the rows "generate_stream, one batch of equal prompts"
are sample.py's own step (NumPy on a CPU) on one batch of identical prompts, no server:
a ceiling to compare with.
serve.py runs at one thread by default (OMP_NUM_THREADS=1, as bench.py gpt2_cpu; --threads
N for more): its worker shares the cores with its own HTTP thread and the clients, and
llama-cpp-python's server generates at its default of cpu_count // 2 threads (1 on two
vCPUs). On two vCPUs a second thread of torch's and NumPy's BLAS only contends with
those: `--threads 2` gives the chat model's 16 streams more server CPU per token
(benchmarks/LOG.md). The last column, the server's CPU time per token, changes less than
wall time on a shared machine.
Run it alone on the machine: other load changes every figure.
"""

import dataclasses
import json
import os
import re
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHAT_CONFIG = "configs/chat_arithmetic.py"
GPT2_SHAPE = dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, bias=True, dropout=0.0)
READY = re.compile(r"at http://127\.0\.0\.1:(\d+)/")
CHARS = [chr(c) for c in range(32, 127)]


def add_arguments(parser):
    parser.add_argument("--quick", action="store_true", help="a smoke test: a tiny model, 1 and 2 streams")
    parser.add_argument("--no_llama_cpp", action="store_true", help="leave llama-cpp-python's server out")
    parser.add_argument("--new_tokens", type=int, default=48, help="tokens per reply (default 48)")
    parser.add_argument("--out_dir", default="out-chat-arithmetic", help="where the trained chat model is looked for")
    parser.add_argument("--streams", default="1,4,16", help="concurrencies, comma-separated (default 1,4,16)")
    parser.add_argument("--threads", type=int, default=1,
                        help="OMP_NUM_THREADS of serve.py and of the no-server rows (default 1)")
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="each load's length: every client sends requests in turn, the next as its last reply "
                             "ends, until this many seconds have passed (default 3; 0: one request each)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="loads per concurrency; the fastest is reported (default 3)")
    parser.add_argument("--stream_intervals", default="",
                        help="values of serve.py's --stream_interval, comma-separated: one server each, in the "
                             "same run (default: one server at serve.py's default)")
    parser.add_argument("--models", default="chat,gpt2",
                        help="which models, comma-separated: chat (the chat recipe's), gpt2 (GPT-2 124M's shape)")


def zero_turn_rows(model, base):
    """Random weights: the turn tokens' output rows set to zero, so greedy never picks them."""
    import torch

    with torch.no_grad():
        model.lm_head.weight[base:].zero_()
    return model


def random_chat_checkpoint(path, shape, tokenizer_dict, base):
    import torch

    from gptkit.ops.checkpoint import save_checkpoint
    from model import GPT, GPTConfig

    torch.manual_seed(0)
    config = GPTConfig(**{**shape, "vocab_size": base + 4})
    model = zero_turn_rows(GPT(config), base)
    save_checkpoint({"format_version": 1, "model": model.state_dict(), "model_config": dataclasses.asdict(config),
                     "tokenizer": tokenizer_dict}, path)
    return path


def chat_shape():
    from gptkit.config import read_config_file
    from model import GPTConfig

    fields = {f.name for f in dataclasses.fields(GPTConfig)}
    return {k: v for k, v in read_config_file(str(REPO / CHAT_CONFIG)).items() if k in fields}


def models(args, work):
    """[(label, checkpoint path, where its weights come from)]."""
    if args.quick:
        shape = dict(n_layer=1, n_head=2, n_embd=32, block_size=64, dropout=0.0)
        path = random_chat_checkpoint(work / "tiny" / "ckpt.pt", shape, {"type": "char", "chars": CHARS}, len(CHARS))
        return [("tiny 1x2x32 chat model", path, "random weights")]
    from gptkit.models import loading
    from gptkit.ops.errors import UserError

    wanted = {m.strip() for m in args.models.split(",") if m.strip()}
    if not wanted or wanted - {"chat", "gpt2"}:
        raise UserError(f"--models {args.models!r}: give chat, gpt2 or both (chat,gpt2)")
    out = []
    if "chat" in wanted:
        try:
            trained = loading.find_checkpoint(args.out_dir)
            out.append((f"{CHAT_CONFIG} chat model", trained, f"trained, {trained}"))
        except UserError:
            path = random_chat_checkpoint(work / "chat" / "ckpt.pt", chat_shape(), {"type": "char", "chars": CHARS},
                                          len(CHARS))
            out.append((f"{CHAT_CONFIG} shape, chat", path, "random weights"))
    if "gpt2" in wanted:
        path = random_chat_checkpoint(work / "gpt2" / "ckpt.pt", GPT2_SHAPE, {"type": "gpt2"}, 50257)
        out.append(("GPT-2 124M shape, chat", path, "random weights"))
    return out


def wait_ready(proc, pattern, timeout=300):
    deadline = time.monotonic() + timeout
    lines = []
    while time.monotonic() < deadline:
        if not select.select([proc.stderr], [], [], 1.0)[0]:
            continue
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        found = pattern.search(line)
        if found:
            return int(found.group(1))
    proc.kill()
    raise RuntimeError("server did not start: " + "".join(lines[-5:]))


def start_serve(ckpt, threads, stream_interval=None):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    env.pop("GPT_FAULTS", None)
    env.pop("GPTKIT_API_KEY", None)
    proc = subprocess.Popen([sys.executable, str(REPO / "serve.py"), f"--ckpt={ckpt}", "--port=0", "--device=cpu",
                             "--queue_size=64", "--model_name=bench",
                             *([] if stream_interval is None else [f"--stream_interval={stream_interval}"])],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return proc, wait_ready(proc, READY)


def start_llama_cpp(gguf, n_ctx):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
                             "--port", str(port), "--n_ctx", str(n_ctx), "--model_alias", "bench"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return proc, wait_ready(proc, re.compile(rf"(?:Uvicorn running on http://127\.0\.0\.1:)({port})"))


def load(port, streams, seconds, new_tokens, pid=None):
    """(median TTFT, slowest TTFT, tokens per wall second over all streams, tokens per reply,
    (the server's CPU seconds meanwhile or None, tokens)): `streams` clients at once, each
    sending requests in turn for `seconds`, from benchmarks/serve_clients.py (one asyncio process)."""
    out = subprocess.run([sys.executable, "-m", "benchmarks.serve_clients", str(port), str(streams), str(seconds),
                          str(new_tokens), *([str(pid)] if pid else [])], cwd=REPO, capture_output=True, text=True,
                         timeout=1200)
    if out.returncode:
        raise RuntimeError(f"the clients failed: {out.stderr.strip().splitlines()[-1:]}")
    report = json.loads(out.stdout)
    ttft = [r[0] for r in report["results"]]
    tokens = sum(r[1] for r in report["results"])
    return (statistics.median(ttft), max(ttft), tokens / report["wall"], tokens / len(ttft),
            (report["server_cpu"], tokens))


def run(args):
    from benchmarks.one_thread import in_one_thread
    from benchmarks.report import Table
    from gptkit.ops.errors import UserError

    if args.threads < 1:
        raise UserError(f"--threads {args.threads}: give at least 1")
    if args.threads == 1:
        in_one_thread("serve")  # bench.py runs again with OMP_NUM_THREADS=1 (NumPy's BLAS reads it at import)
    else:
        import torch

        torch.set_num_threads(args.threads)
    counts = [1, 2] if args.quick else [int(s) for s in args.streams.split(",")]
    repeats = 1 if args.quick else args.repeats
    if repeats < 1:
        raise UserError(f"--repeats {repeats}: give at least 1")
    new_tokens = 8 if args.quick else args.new_tokens
    seconds = 0.0 if args.quick else args.seconds
    if not 0 <= seconds <= 600:
        raise UserError(f"--seconds {seconds}: give 0 to 600")
    try:
        intervals = [float(x) for x in args.stream_intervals.split(",")] if args.stream_intervals else [None]
    except ValueError:
        raise UserError(f"--stream_intervals {args.stream_intervals!r}: give seconds, comma-separated") from None
    table = Table(
        f"serve.py: concurrent streamed chat replies, {new_tokens} tokens each, CPU",
        ["model", "server", "streams", "TTFT median (s)", "TTFT slowest (s)", "tokens/s, all streams",
         "tokens per reply", "server CPU ms per token"],
        note=f"Greedy replies through /v1/chat/completions with stream=true: that many clients at once, each "
             f"sending requests in turn for {seconds:g} s (one asyncio client process, "
             f"benchmarks/serve_clients.py), the fastest of {repeats} such loads; TTFT: the request sent to its "
             "first content chunk (median and slowest over the load's requests); tokens/s: the replies' "
             "completion tokens over the load's wall time; server CPU ms per token: the server process's "
             "user + system CPU time over its tokens, all loads together (a shared machine stretches wall time "
             "more than CPU time). serve.py batches the streams continuously; llama-cpp-python's server runs one "
             f"request at a time. serve.py and the no-server rows at OMP_NUM_THREADS={args.threads}; "
             "llama-cpp-python's server at its default threads.",
    )
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as work:
        for label, ckpt, source in models(args, Path(work)):
            servers = [("serve.py" if x is None else f"serve.py --stream_interval {x:g}",
                        lambda x=x: start_serve(ckpt, args.threads, x)) for x in intervals]
            if not args.no_llama_cpp and not args.quick:
                gguf = export_gguf(ckpt, Path(work))
                if isinstance(gguf, str):
                    print(f"{label}: llama-cpp-python left out ({gguf})", file=sys.stderr)
                else:
                    servers.append(("llama-cpp-python server (f32 GGUF)", lambda: start_llama_cpp(gguf, 1024)))
            for streams in counts:  # the ceiling batching could reach: one batch of equal prompts, no server
                table.add_row(f"{label} ({source})", "generate_stream, one batch of equal prompts (no server)",
                              streams, "-", "-", round(batched_rate(ckpt, streams, new_tokens), 1), new_tokens, "-")
            for name, start in servers:
                proc, port = start()
                try:
                    for streams in counts:  # the fastest of --repeats loads: a shared machine only slows one
                        runs = [load(port, streams, seconds, new_tokens, proc.pid) for _ in range(repeats)]
                        median, slowest, rate, per, _ = max(runs, key=lambda r: r[2])
                        cpu = [r[4] for r in runs if r[4][0] is not None]  # over all the loads: clock ticks are 10 ms
                        cpu_s, tokens = sum(c for c, _ in cpu), sum(t for _, t in cpu)
                        per_token = f"{1e3 * cpu_s / tokens:.3f}" if cpu_s and tokens else "-"  # 0: under a tick
                        table.add_row(f"{label} ({source})", name, streams, round(median, 3), round(slowest, 3),
                                      round(rate, 1), round(per, 1), per_token)
                finally:
                    proc.terminate()
                    proc.wait(timeout=60)
    return [table]


def batched_rate(ckpt, batch, new_tokens):
    """Tokens per second of `batch` equal prompts generated as one batch in this process
    (greedy, sample.py's CPU parts, no server): a ceiling for serving in batches."""
    import torch

    from gptkit.models import loading
    from gptkit.ops.checkpoint import load_checkpoint
    from gptkit.fast import cpu_linears
    from gptkit.generation.generate import generate_stream

    model, tokenizer, _ = loading.model_from_checkpoint(load_checkpoint(ckpt), ckpt)
    cpu_linears.swap_linears(model, "float32", print)
    idx = torch.tensor([tokenizer.encode("What is 1+2?")] * batch, dtype=torch.long)
    best = float("inf")
    for _ in range(2):  # the first also warms up
        t0 = time.perf_counter()
        for _ in generate_stream(model, idx, new_tokens, temperature=0):
            pass
        best = min(best, time.perf_counter() - t0)
    return batch * new_tokens / best


def export_gguf(ckpt, work):
    """Our GGUF of the checkpoint, or a string saying why there is none."""
    try:
        import llama_cpp.server.app  # noqa: F401  (the [server] extra)
    except ImportError as e:
        return f"llama-cpp-python[server] is not installed: {e}"
    import convert
    from gptkit.ops.errors import UserError

    dest = work / f"{Path(ckpt).parent.name}.gguf"
    try:
        code = convert.main([str(ckpt), str(dest), "--to", "gguf", "--outtype", "f32"])
    except UserError as e:
        return f"not exportable to GGUF: {e}"
    return dest if code == 0 else f"convert.py exited {code}"
