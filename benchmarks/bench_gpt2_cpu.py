"""GPT-2 124M sampling on a CPU, batch 1, one thread: ours against what users would otherwise run.

    python bench.py gpt2_cpu                  # ours (fp32 and --dtype float16), transformers' generate (fp32, fp16, bf16), llama.cpp
    python bench.py gpt2_cpu --new_tokens 40  # shorter

One GPT-2 124M with random weights (speed does not depend on them; offline) is
run by: our sample path (gptkit.generate.generate_stream, the KV cache) with
sample.py's default CPU step (gptkit/cpu_decode.py) and with model.py's PyTorch
step (--cpu_decode false) and with --dtype float16 (float16 copies of the matrices),
transformers' `generate` with its KV cache on the same weights exported by
`convert.py --to hf`'s code (in fp32, and cast to float16 and bfloat16), and
llama.cpp (llama-cpp-python, requirements-gguf.txt) on our own `--to gguf` exports
in f32 and q8_0. All greedy,
the same prompt, in this process at one thread (torch.set_num_threads(1), llama.cpp
n_threads=1), the samplers alternating A B C ... and the best of --repeats kept.
Per token: the CPU seconds (process_time) between the first new token and the last
over (n - 1), so the prompt and start-up cancel. The floor: every weight read once
per token at this thread's measured read bandwidth.
With --profile, a torch profile of model.py's PyTorch step (printed) says where its time goes.
"""

import sys
import tempfile
import time
from pathlib import Path

import torch

from gptkit.errors import UserError

PROMPT = [464, 3290, 286, 1204, 318]  # GPT-2 ids of "The meaning of life is"


def add_arguments(parser):
    parser.add_argument("--new_tokens", type=int, default=100, help="new tokens per run (default 100)")
    parser.add_argument("--repeats", type=int, default=2, help="alternating repeats, best kept (default 2)")
    parser.add_argument("--no_llama_cpp", action="store_true", help="leave llama.cpp out")
    parser.add_argument("--profile", action="store_true", help="also profile our fp32 decoding (top operators)")
    parser.add_argument("--seed", type=int, default=1337)


class Stamps:
    """CPU and wall time at each new token."""

    def __init__(self):
        self.cpu, self.wall = [], []

    def tick(self):
        self.cpu.append(time.process_time())
        self.wall.append(time.perf_counter())

    def per_token(self):
        n = len(self.cpu)
        if n < 3:
            raise RuntimeError(f"only {n} tokens were generated")
        return (self.cpu[-1] - self.cpu[0]) / (n - 1), (self.wall[-1] - self.wall[0]) / (n - 1)


def ours(model, n, decoder=None):
    from gptkit.generate import generate_stream

    stamps = Stamps()
    idx = torch.tensor([PROMPT])
    for _ in generate_stream(model, idx, n, temperature=0, decoder=decoder):
        stamps.tick()
    return stamps


def transformers_generate(hf_model, n):
    from transformers.generation.streamers import BaseStreamer

    stamps = Stamps()

    class Streamer(BaseStreamer):
        first = True

        def put(self, value):
            if self.first:  # the prompt
                self.first = False
                return
            stamps.tick()

        def end(self):
            pass

    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                          do_sample=False, use_cache=True, streamer=Streamer(), pad_token_id=0)
    return stamps


def llama_cpp_generate(llm, n):
    stamps = Stamps()
    llm.reset()
    count = 0
    for _ in llm.generate(PROMPT, temp=0.0, top_k=1, reset=True):
        stamps.tick()
        count += 1
        if count == n:
            break
    return stamps


def load_llama_cpp(path, n_ctx):
    import llama_cpp

    defaults = llama_cpp.llama_cpp.llama_model_default_params

    def without_repacking():  # see tests/interop/test_gguf.py: repacked q8_0 kernels crash on some CPUs
        params = defaults()
        params.use_extra_bufts = False
        return params

    llama_cpp.llama_cpp.llama_model_default_params = without_repacking
    try:
        return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=64, n_threads=1, n_threads_batch=1,
                               verbose=False, seed=0)
    finally:
        llama_cpp.llama_cpp.llama_model_default_params = defaults


def build(work, seed):
    """(our model, run folder) for a random GPT-2 124M saved as a run of ours."""
    import dataclasses

    from gptkit.checkpoint import FORMAT_VERSION, save_checkpoint
    from gptkit.tokenizer import GPT2Tokenizer
    from model import GPT, GPTConfig

    torch.manual_seed(seed)
    model = GPT(GPTConfig()).eval()
    run = work / "run"
    run.mkdir(parents=True)
    save_checkpoint({"format_version": FORMAT_VERSION, "model": model.state_dict(),
                     "model_config": dataclasses.asdict(model.config), "tokenizer": GPT2Tokenizer().to_dict(),
                     "iter_num": 0}, run / "ckpt.pt")
    return model, run


def profile_ours(model, n, top=8):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        ours(model, n)
    rows = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)
    print(rows, file=sys.stderr)
    return rows


def run(args):
    with tempfile.TemporaryDirectory(prefix="bench-gpt2-") as work:  # 1.6 GB of exports, removed after
        return measure(args, Path(work))


def measure(args, work):
    import copy

    from benchmarks.bench_sample import measure_floor_rates
    from benchmarks.report import Table
    from gptkit.cpu_decode import CPUDecoder, has_fbgemm, round_to_float16, round_to_int8
    from gptkit.interop.hf_gpt2 import export_gpt2

    if args.new_tokens < 3:
        raise UserError("--new_tokens must be at least 3")
    torch.set_num_threads(1)
    n = args.new_tokens
    model, run_dir = build(work, args.seed)
    laid_out = copy.deepcopy(model)
    decoder = CPUDecoder(laid_out)
    half = copy.deepcopy(model)
    round_to_float16(half)
    half_decoder = CPUDecoder(half, weights="float16")
    half_label = f"ours, --dtype float16 ({'fbgemm' if has_fbgemm() else 'NumPy'} products, float32 arithmetic)"
    int8 = copy.deepcopy(model)
    round_to_int8(int8)
    int8_decoder = CPUDecoder(int8, weights="int8")
    int8_label = f"ours, --dtype int8 ({'fbgemm int8' if has_fbgemm() else 'NumPy float32'} products)"
    samplers = {"ours, sample.py's CPU step (NumPy)": lambda: ours(laid_out, n, decoder),
                "ours, PyTorch step (--cpu_decode false)": lambda: ours(model, n),
                half_label: lambda: ours(half, n, half_decoder),
                int8_label: lambda: ours(int8, n, int8_decoder)}
    try:
        import transformers

        export_gpt2(model, work / "hf")
        hf = transformers.GPT2LMHeadModel.from_pretrained(work / "hf").eval()
        samplers[f"transformers {transformers.__version__} generate (KV cache), fp32"] = lambda: transformers_generate(hf, n)
        for dtype in ("float16", "bfloat16"):  # its own half-precision weights (and arithmetic)
            hf_half = copy.deepcopy(hf).to(getattr(torch, dtype))
            samplers[f"transformers {transformers.__version__} generate (KV cache), {dtype}"] = (
                lambda hf_half=hf_half: transformers_generate(hf_half, n))
    except ImportError:
        print("[gpt2_cpu] transformers is not installed: its row is left out", file=sys.stderr)
    if not args.no_llama_cpp:
        try:
            import llama_cpp
        except ImportError:
            llama_cpp = None
            print("[gpt2_cpu] llama-cpp-python is not installed (pip install -r requirements-gguf.txt): "
                  "its rows are left out", file=sys.stderr)
        if llama_cpp is not None:
            from gptkit.interop.gguf_export import export_gguf

            for outtype in ("f32", "q8_0"):
                path = work / f"gpt2-{outtype}.gguf"
                export_gguf(str(run_dir), str(path), outtype)
                llm = load_llama_cpp(path, n_ctx=len(PROMPT) + n + 8)
                samplers[f"llama.cpp {llama_cpp.__version__} ({outtype} GGUF of the same weights)"] = (
                    lambda llm=llm: llama_cpp_generate(llm, n))
    best = {label: (float("inf"), float("inf")) for label in samplers}
    for _ in range(args.repeats):
        for label, fn in samplers.items():
            cpu, wall = fn().per_token()
            best[label] = (min(best[label][0], cpu), min(best[label][1], wall))
    bandwidth, _ = measure_floor_rates()
    fp32_bytes = sum(p.numel() * 4 for p in model.parameters())
    floor = {"fp32": fp32_bytes / bandwidth}
    base = best["ours, sample.py's CPU step (NumPy)"][0]
    hf_label = next((k for k in samplers if k.startswith("transformers") and k.endswith("fp32")), None)
    table = Table(
        f"GPT-2 124M (random weights), batch 1, greedy, {n} new tokens, one thread, CPU",
        ["sampler", "CPU ms/token", "wall ms/token", "tokens/CPU s", "vs transformers", "vs ours"],
        note=f"All in one process at one thread, alternating, best of {args.repeats}; per token = CPU s "
        f"(process_time) from the first new token to the last / ({n} - 1). Floor: {fp32_bytes / 1e6:.0f} MB of "
        f"fp32 weights read once per token at {bandwidth / 1e9:.1f} GB/s (this thread, measured) = "
        f"{1000 * floor['fp32']:.1f} ms (float16 weights are 0.5x those bytes, q8_0 ~0.27x). vs transformers: "
        f"against its fp32 row. ours --dtype float16: every weight rounded to float16, the products reading "
        f"float16 copies; transformers float16/bfloat16: the model cast (weights and arithmetic).",
    )
    for label, (cpu, wall) in best.items():
        vs_hf = f"{best[hf_label][0] / cpu:.2f}x" if hf_label else "—"
        table.add_row(label, round(1000 * cpu, 2), round(1000 * wall, 2), round(1 / cpu, 1), vs_hf, f"{base / cpu:.2f}x")
    tables = [table]
    if args.profile:  # printed, not logged: the summary goes into BENCHMARKS.md in words
        profile_ours(model, min(n, 40))
    return tables
