"""GPT-2 124M sampling on a CPU, batch 1, one thread: ours against what users would otherwise run.

    python bench.py gpt2_cpu                  # ours (fp32 and --dtype float16), transformers' generate (fp32, fp16, bf16), llama.cpp
    python bench.py gpt2_cpu --new_tokens 40  # shorter

One GPT-2 124M with random weights (speed does not depend on them; offline) is
run by: our sample path (gptkit.generation.generate.generate_stream, the KV cache, model.py's
forward) with sample.py's default CPU parts (gptkit/fast/cpu_linears.py's NumPyLinear),
with nn.Linear as written (--cpu_decode false), and with --dtype float16 and int8
(Float16Linear, Int8Linear),
transformers' `generate` with its KV cache on the same weights exported by
`convert.py --to hf`'s code (in fp32, and cast to float16 and bfloat16), and
llama.cpp (llama-cpp-python, requirements-gguf.txt) on our own `--to gguf` exports
in f32 and q8_0. All greedy,
the same prompt, in this process at one thread (OMP_NUM_THREADS=1, set by re-running itself where
it is not: torch and NumPy's BLAS; llama.cpp n_threads=1), the samplers alternating A B C ... and the best of --repeats kept.
Per token: the CPU seconds (process_time) between the first new token and the last
over (n - 1), so the prompt and start-up cancel. The floor: every weight read once
per token at this thread's measured read bandwidth.
The int8 path's cost (a second table): the validation text scored through the
decode step itself, one token at a time from a fresh cache in windows (float32
weights against --dtype int8's), on GPT-2's shape (these random weights, the
text in GPT-2 tokens) and on the quick-start model (--quick_start, default
out-shakespeare's checkpoint, when present): mean loss, its rise, the share of
positions whose top token is float32's, and the largest logit gap over the
largest logit.
With --profile, a torch profile of model.py's PyTorch step (printed) says where its time goes.
"""

import sys
import tempfile
import time
from pathlib import Path

import torch

from gptkit.ops.errors import UserError

PROMPT = [464, 3290, 286, 1204, 318]  # GPT-2 ids of "The meaning of life is"


def add_arguments(parser):
    parser.add_argument("--new_tokens", type=int, default=100, help="new tokens per run (default 100)")
    parser.add_argument("--repeats", type=int, default=2, help="alternating repeats, best kept (default 2)")
    parser.add_argument("--no_llama_cpp", action="store_true", help="leave llama.cpp out")
    parser.add_argument("--profile", action="store_true", help="also profile our fp32 decoding (top operators)")
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--quick_start", default="out-shakespeare",
                        help="a run folder of the quick start (configs/shakespeare.py) whose int8 cost is measured too")
    parser.add_argument("--cost_windows", type=int, default=16, help="validation windows scored per model (default 16)")
    parser.add_argument("--no_cost", action="store_true", help="leave the int8 cost table out")


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


def ours(model, n):
    from gptkit.generation.generate import generate_stream

    stamps = Stamps()
    idx = torch.tensor([PROMPT])
    for _ in generate_stream(model, idx, n, temperature=0):
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


def llama_cpp_instructions(llama_cpp):
    """The vector instructions this llama.cpp was built for, from its system info: e.g.
    "[AVX2]" for a build with GGML_NATIVE=OFF GGML_AVX512=OFF, "[AVX2 AVX512 AVX512_VNNI]"."""
    info = llama_cpp.llama_print_system_info().decode(errors="replace")
    names = [name for name in ("AVX2", "AVX_VNNI", "AVX512", "AVX512_VNNI", "AVX512_BF16") if f"{name} = 1" in info]
    return "[" + " ".join(names) + "]"


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

    from gptkit.ops.checkpoint import FORMAT_VERSION, save_checkpoint
    from gptkit.data.tokenizer import GPT2Tokenizer
    from model import GPT, GPTConfig

    torch.manual_seed(seed)
    model = GPT(GPTConfig()).eval()
    run = work / "run"
    run.mkdir(parents=True)
    save_checkpoint({"format_version": FORMAT_VERSION, "model": model.state_dict(),
                     "model_config": dataclasses.asdict(model.config), "tokenizer": GPT2Tokenizer().to_dict(),
                     "iter_num": 0}, run / "ckpt.pt")
    return model, run


@torch.inference_mode()
def decode_scores(model, windows):
    """(mean loss, argmax, logits) of windows (B, L + 1) scored through the KV cache one token at a time."""
    from model import KVCache

    cache = KVCache(model.config.n_layer, model.config.block_size)
    logits = [model.next_token_logits(windows[:, :1], cache)]
    for t in range(1, windows.size(1) - 1):
        logits.append(model.next_token_logits(windows[:, t : t + 1], cache))
    logits = torch.stack(logits, 1)  # (B, L, vocab)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten())
    return loss.item(), logits.argmax(-1), logits


def int8_cost(label, model, windows):
    """One row: float32 against int8 weights on the same windows, through the decode step."""
    full, int8 = with_parts(model, "float32"), with_parts(model, "int8")
    loss32, top32, logits32 = decode_scores(full, windows)
    loss8, top8, logits8 = decode_scores(int8, windows)
    gap = ((logits8 - logits32).abs().max() / logits32.abs().max()).item()
    return [label, windows.numel() - windows.size(0), round(loss32, 4), round(loss8, 4), f"{loss8 - loss32:+.4f}",
            f"{100 * (top8 == top32).float().mean().item():.1f}%", f"{100 * gap:.2f}%"]


def with_parts(model, weights):
    """A copy of `model` with gptkit/fast/cpu_linears.py's parts for `weights` swapped in, as sample.py does."""
    import copy

    from gptkit.fast import cpu_linears

    net = copy.deepcopy(model)
    cpu_linears.swap_linears(net, weights, lambda line: print(f"[gpt2_cpu] {line}", file=sys.stderr))
    return net


def val_windows(tokens, count, length, seed):
    """count windows of length + 1 tokens at random places of the 1-D tensor `tokens`."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(tokens) - length - 1, (count,), generator=g)
    return torch.stack([tokens[s : s + length + 1] for s in starts.tolist()])


def cost_table(args, gpt2_model, Table):
    """The int8 cost on the quick-start model (when its run folder is there) and GPT-2's shape."""
    import json

    import numpy as np

    from gptkit.models.loading import load_model
    from gptkit.data.tokenizer import GPT2Tokenizer, tokenizer_from_dict

    table = Table("--dtype int8's cost: the validation text through the decode step, float32 against int8 weights",
                  ["model", "tokens scored", "float32 loss", "int8 loss", "rise", "top-1 as float32", "largest logit gap"],
                  note="Windows at random places of the quick-start data's val split (data/shakespeare_char), "
                  f"{args.cost_windows} per model, each scored token by token from a fresh cache (model.py with gptkit/fast/cpu_linears.py's "
                  "NumPyLinear against Int8Linear). GPT-2's shape: the random weights "
                  "above, the same text in GPT-2 tokens (its loss is near ln 50257: the rise measures the rounding, "
                  "not a trained model's loss). Logit gap: the largest |int8 - float32| over the largest |float32| logit.")
    val = Path("data/shakespeare_char/val.bin")
    if not val.is_file():
        print("[gpt2_cpu] data/shakespeare_char is not prepared (python prepare.py shakespeare_char): "
              "the int8 cost table is left out", file=sys.stderr)
        return None
    meta = json.loads((val.parent / "meta.json").read_text())
    ids = np.fromfile(val, dtype=meta["dtype"]).astype(np.int64)
    text = tokenizer_from_dict(meta["tokenizer"]).decode(ids.tolist())
    run = Path(args.quick_start)
    if (run / "best.pt").is_file() or (run / "ckpt.pt").is_file():
        model, _, _ = load_model("resume", str(run))
        table.add_row(*int8_cost(f"quick start ({run}/)", model, val_windows(torch.from_numpy(ids), args.cost_windows,
                                                                          model.config.block_size, args.seed)))
    else:
        print(f"[gpt2_cpu] no checkpoint in {run}/ (python train.py configs/shakespeare.py): its row is left out",
              file=sys.stderr)
    gpt2_ids = torch.tensor(GPT2Tokenizer().encode(text))
    table.add_row(*int8_cost("GPT-2 124M's shape (random weights)", gpt2_model,
                             val_windows(gpt2_ids, args.cost_windows, 128, args.seed)))
    return table


def profile_ours(model, n, top=8):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        ours(model, n)
    rows = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)
    print(rows, file=sys.stderr)
    return rows


def run(args):
    from benchmarks.one_thread import in_one_thread

    in_one_thread("gpt2_cpu")
    with tempfile.TemporaryDirectory(prefix="bench-gpt2-") as work:  # 1.6 GB of exports, removed after
        return measure(args, Path(work))


def measure(args, work):
    import copy

    from benchmarks.bench_sample import measure_floor_rates
    from benchmarks.report import Table
    from gptkit.fast import cpu_linears
    from gptkit.interop.hf_gpt2 import export_gpt2

    if args.new_tokens < 3:
        raise UserError("--new_tokens must be at least 3")
    torch.set_num_threads(1)
    n = args.new_tokens
    model, run_dir = build(work, args.seed)
    parts = {weights: with_parts(model, weights) for weights in ("float32", "float16", "int8")}
    product = parts["int8"].transformer.h[0].mlp.c_fc.product
    samplers = {"ours, sample.py's default (NumPyLinear)": lambda: ours(parts["float32"], n),
                "ours, nn.Linear (--cpu_decode false)": lambda: ours(model, n),
                "ours, --dtype float16 (Float16Linear)": lambda: ours(parts["float16"], n),
                f"ours, --dtype int8 (Int8Linear, {product})": lambda: ours(parts["int8"], n)}
    if parts["int8"].transformer.h[0].mlp.c_fc.kernel is not None:  # the product it replaced, for comparison
        parts["int8 torch"] = net = copy.deepcopy(model)
        net.swapped_linears = [(name, parent, attr, linear)  # as swap_linears records them
                               for parent, attr, name, linear in cpu_linears.linears(net)]
        for _, parent, attr, linear in net.swapped_linears:
            setattr(parent, attr, cpu_linears.Int8Linear(linear))  # no kernel: torch._weight_int8pack_mm
        samplers["ours, --dtype int8 (Int8Linear, torch._weight_int8pack_mm)"] = lambda: ours(parts["int8 torch"], n)
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

            built = llama_cpp_instructions(llama_cpp)
            for outtype in ("f32", "q8_0"):
                path = work / f"gpt2-{outtype}.gguf"
                export_gguf(str(run_dir), str(path), outtype)
                llm = load_llama_cpp(path, n_ctx=len(PROMPT) + n + 8)
                samplers[f"llama.cpp {llama_cpp.__version__} {built} ({outtype} GGUF of the same weights)"] = (
                    lambda llm=llm: llama_cpp_generate(llm, n))
    best = {label: (float("inf"), float("inf")) for label in samplers}
    for _ in range(args.repeats):
        for label, fn in samplers.items():
            cpu, wall = fn().per_token()
            best[label] = (min(best[label][0], cpu), min(best[label][1], wall))
    bandwidth, _ = measure_floor_rates()
    fp32_bytes = sum(p.numel() * 4 for p in model.parameters())
    floor = {"fp32": fp32_bytes / bandwidth}
    base = best["ours, sample.py's default (NumPyLinear)"][0]
    hf_label = next((k for k in samplers if k.startswith("transformers") and k.endswith("fp32")), None)
    table = Table(
        f"GPT-2 124M (random weights), batch 1, greedy, {n} new tokens, one thread, CPU",
        ["sampler", "CPU ms/token", "wall ms/token", "tokens/CPU s", "vs transformers", "vs ours"],
        note=f"All in one process at one thread, alternating, best of {args.repeats}; per token = CPU s "
        f"(process_time) from the first new token to the last / ({n} - 1). Floor: {fp32_bytes / 1e6:.0f} MB of "
        f"fp32 weights read once per token at {bandwidth / 1e9:.1f} GB/s (this thread, measured) = "
        f"{1000 * floor['fp32']:.1f} ms (float16 weights are 0.5x those bytes, q8_0 ~0.27x). vs transformers: "
        f"against its fp32 row. ours --dtype float16 / int8: model.py's forward with float16 copies of the matrices "
        f"(float16 inputs) / int8 copies swapped in (inputs rounded to int8 per row in gptkit/fast/int8_kernel.c, to "
        f"bfloat16 for torch._weight_int8pack_mm); transformers float16/bfloat16: the model cast "
        f"(weights and arithmetic).",
    )
    for label, (cpu, wall) in best.items():
        vs_hf = f"{best[hf_label][0] / cpu:.2f}x" if hf_label else "—"
        table.add_row(label, round(1000 * cpu, 2), round(1000 * wall, 2), round(1 / cpu, 1), vs_hf, f"{base / cpu:.2f}x")
    tables = [table]
    if not args.no_cost:
        cost = cost_table(args, model, Table)
        tables += [cost] if cost is not None else []
    if args.profile:  # printed, not logged: the summary goes into BENCHMARKS.md in words
        profile_ours(model, min(n, 40))
    return tables
