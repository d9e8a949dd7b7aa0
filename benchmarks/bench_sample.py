"""Generation speed: new tokens per second with and without the key/value cache.

    python bench.py sample            # both tables below (the no-cache runs take minutes)
    python bench.py sample --quick    # a smoke test: a few dozen tokens each
    python bench.py sample --compile  # sample.py --compile's decoding step against the eager cache

Table 1: nanoGPT's baby GPT shape (6 layers, 6 heads, 384 wide, block
256, 65-character vocabulary; random weights, since speed does not depend on
them), batch 1, 1,000 new tokens. Table 2: what `python sample.py`
does by default, 10 samples of 500 tokens generated as one batch, from the
quick-start model (out-shakespeare/best.pt or ckpt.pt when present, else the
shape of configs/shakespeare.py with random weights; the table says which),
timed through generate.generate_samples, so decoding and --stop checks count.

Each table has three rows, all in one run so the ratios are fair on a noisy
machine: no cache (the whole cropped context every token, nanoGPT's way); the
cache (exactly the same tokens; past block_size the window slides, so every
step recomputes it and the cache only helps until then); and the cache with
shift_context (past block_size keep half the window and go on caching).
Table 1 adds the last with bfloat16 weights: batch-1 decoding on a CPU is bound
by memory bandwidth (every weight is read once per token), so half the bytes
is nearly twice the speed.

With --one_thread the baby-GPT rows are sample.py processes: nanoGPT's own, ours by
default (model.py's forward with gptkit/fast/cpu_linears.py's NumPyLinear parts), ours with
nn.Linear as written (--cpu_decode false), and ours --compile, whose compile time is given
for an empty and for a warm inductor cache.

--compile instead times the compiled one-token step (gptkit/fast/compiled_decode.py)
against the eager cache, greedy, for block_size - 2 tokens (no context shift),
with the seconds the first compile took; eager and compiled runs alternate and
the best of each is kept.
"""

import copy
import dataclasses
import os
import time
from pathlib import Path

import torch

from gptkit.ops.errors import UserError
from gptkit.generation import generate

BABY_GPT = dict(n_layer=6, n_head=6, n_embd=384, block_size=256, vocab_size=65, bias=False, dropout=0.0)
QUICK_START_CONFIG = "configs/shakespeare.py"
REPO = Path(__file__).resolve().parent.parent
MODES = [  # (row label, use_cache, shift_context)
    ("no cache: recompute the context (nanoGPT)", False, False),
    ("KV cache (same tokens as recomputing)", True, False),
    ("KV cache + shift_context (sample.py's default)", True, True),
]


def add_arguments(parser):
    parser.add_argument("--quick", action="store_true", help="a smoke test: a few dozen tokens per run")
    parser.add_argument("--compile", action="store_true", help="time sample.py --compile's decoding step instead")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, ... (default cpu)")
    parser.add_argument("--out_dir", default="out-shakespeare", help="where the quick-start model is looked for")
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--one_thread", action="store_true",
                        help="CPU seconds per process at one thread (sample.py as subprocesses), against nanoGPT's sample.py with --nanogpt")
    parser.add_argument("--nanogpt", default=None, help="a nanoGPT checkout to compare with (default: $NANOGPT_DIR)")
    parser.add_argument("--new_tokens", type=int, default=1000, help="--one_thread: new tokens per baby-GPT sample")
    parser.add_argument("--repeats", type=int, default=2, help="--one_thread: interleaved repeats (best is kept)")
    parser.add_argument("--before", default=None,
                        help="--one_thread: another checkout of this project (say, an earlier commit) whose sample.py "
                        "runs the default, float16 and int8 rows too, in the same run")
    parser.add_argument("--no_exact", action="store_true",
                        help="--one_thread: leave out the exact row (--shift_context false; ~75 CPU s a run)")


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_stream(model, idx, n, use_cache, shift_context, device, seed):
    """Seconds to generate n tokens per row of idx, after a short warm-up."""
    generator = torch.Generator(device=device).manual_seed(seed)
    options = dict(temperature=1.0, generator=generator, use_cache=use_cache, shift_context=shift_context)
    for _ in generate.generate_stream(model, idx, 2, **options):  # warm-up: allocator, thread pool
        pass
    sync(device)
    t0 = time.perf_counter()
    count = 0
    for _ in generate.generate_stream(model, idx, n, **options):
        count += 1
    sync(device)
    assert count == n, f"generated {count} of {n} tokens"
    return time.perf_counter() - t0


def add_rows(table, timings, new_tokens):
    """One row per mode: tokens/s and the speed-up over recomputing."""
    base = new_tokens / timings[0]
    for (label, _, _), seconds in zip(MODES, timings):
        rate = new_tokens / seconds
        table.add_row(label, new_tokens, round(seconds, 2), round(rate, 1), f"{rate / base:.1f}x")


def baby_gpt_table(args, device):
    from benchmarks.report import Table
    from model import GPT, GPTConfig

    n = 16 if args.quick else 1000
    torch.manual_seed(args.seed)
    model = GPT(GPTConfig(**BABY_GPT)).to(device).eval()
    idx = torch.zeros(1, 1, dtype=torch.long, device=device)  # a one-token prompt
    timings = [time_stream(model, idx, n, cache, shift, device, args.seed) for _, cache, shift in MODES]
    # One token at a time reads every weight once per step, so on a CPU the cached
    # path is bound by memory bandwidth: bfloat16 weights (sample.py --dtype bfloat16) halve the bytes.
    half = copy.deepcopy(model).to(torch.bfloat16)
    half_seconds = time_stream(half, idx, n, True, True, device, args.seed)
    table = Table(
        "Generation, baby GPT shape (6x6x384, block 256), batch 1",
        ["generation", "new tokens", "seconds", "tokens/s", "vs no cache"],
        note=f"Random weights, temperature 1, device {device}. Past block_size ({BABY_GPT['block_size']}) "
        "the exact cache path recomputes the sliding window every token, as no-cache does.",
    )
    add_rows(table, timings, n)
    rate = n / half_seconds
    table.add_row("KV cache + shift_context, bfloat16 weights (--dtype bfloat16)", n, round(half_seconds, 2),
                  round(rate, 1), f"{rate / (n / timings[0]):.1f}x")
    return table


def quick_start_model(out_dir):
    """(model, tokenizer, where it came from): the trained quick-start checkpoint when
    there is one, else its shape from configs/shakespeare.py with random weights."""
    from gptkit.models import loading
    from gptkit.ops.checkpoint import load_checkpoint
    from model import GPT
    from gptkit.data.tokenizer import CharTokenizer

    try:
        path = loading.find_checkpoint(out_dir)
    except UserError:
        path = None
    if path is not None:
        model, tokenizer, summary = loading.model_from_checkpoint(load_checkpoint(path), path)
        return model, tokenizer, summary
    chars = [chr(c) for c in range(32, 97)]  # 65 characters, Tiny Shakespeare's vocabulary size
    model = GPT(quick_start_config(len(chars))).eval()
    return model, CharTokenizer(chars), f"no trained model in {out_dir}: {QUICK_START_CONFIG}'s shape, random weights"


def quick_start_config(vocab_size):
    """The GPTConfig of configs/shakespeare.py for a vocabulary of vocab_size."""
    from gptkit.config import read_config_file
    from model import GPTConfig

    fields = {f.name for f in dataclasses.fields(GPTConfig)}
    try:
        shape = {k: v for k, v in read_config_file(QUICK_START_CONFIG).items() if k in fields}
    except UserError:
        shape = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, bias=False)
    return GPTConfig(**{**shape, "vocab_size": vocab_size, "dropout": 0.0})


def quick_start_table(args, device):
    import sample
    from benchmarks.report import Table

    num_samples, n = (2, 80) if args.quick else (10, 500)
    torch.manual_seed(args.seed)
    model, tokenizer, source = quick_start_model(args.out_dir)
    model.to(device)
    prompt_ids = tokenizer.encode("ROMEO:")
    timings = []
    for _, use_cache, shift in MODES:
        cfg = sample.SampleConfig(
            num_samples=num_samples, max_new_tokens=n, seed=args.seed, use_cache=use_cache, shift_context=shift
        )  # sample.py's defaults otherwise: temperature 0.8, top_k 200, fp32 on CPU
        sync(device)
        t0 = time.perf_counter()
        texts = generate.generate_samples(model, tokenizer, prompt_ids, cfg, device)
        sync(device)
        timings.append(time.perf_counter() - t0)
        assert len(texts) == num_samples
    config = model.config
    table = Table(
        f"sample.py: {num_samples} samples of {n} tokens as one batch, quick-start model",
        ["generation", "new tokens", "seconds", "tokens/s", "vs no cache"],
        note=f"{source}. Shape {config.n_layer}x{config.n_head}x{config.n_embd}, block {config.block_size}; "
        f"device {device}; through generate.generate_samples (decoding included).",
    )
    add_rows(table, timings, num_samples * n)
    return table


def time_greedy(model, idx, n, decoder, device):
    """Seconds for n greedy tokens per row of idx, the cache never shifting."""
    sync(device)
    t0 = time.perf_counter()
    for _ in generate.generate_stream(model, idx, n, temperature=0, decoder=decoder):
        pass
    sync(device)
    return time.perf_counter() - t0


def compiled_table(args, device, repeats=3):
    from benchmarks.report import Table
    from gptkit.fast.compiled_decode import CompiledDecoder
    from model import GPT, GPTConfig

    shapes = [("quick start", quick_start_config(65), 1), ("quick start", quick_start_config(65), 10),
              ("baby GPT", GPTConfig(**BABY_GPT), 1)]
    table = Table(
        "sample.py --compile: the compiled one-token step vs the eager cache",
        ["model", "batch", "new tokens", "eager tokens/s", "compiled tokens/s", "compiled vs eager", "compile s"],
        note=f"Random weights, greedy, device {device}, {torch.get_num_threads()} thread(s); best of {repeats} "
        "alternating runs each; compile s: the first compiled step, tracing and code generation.",
    )
    for name, config, batch in shapes:
        torch.manual_seed(args.seed)
        model = GPT(config).to(device).eval()
        n = 8 if args.quick else config.block_size - 2
        idx = torch.zeros(batch, 1, dtype=torch.long, device=device)
        torch._dynamo.reset()
        decoder = CompiledDecoder(model, batch)
        compile_s = time_greedy(model, idx, 1, decoder, device)
        eager, compiled = [], []
        for _ in range(repeats):
            eager.append(batch * n / time_greedy(model, idx, n, None, device))
            compiled.append(batch * n / time_greedy(model, idx, n, decoder, device))
        table.add_row(name, batch, n, round(max(eager), 1), round(max(compiled), 1),
                      f"{max(compiled) / max(eager):.2f}x", round(compile_s, 1))
    torch._dynamo.reset()
    return table


def run(args):
    if args.one_thread:
        return one_thread_tables(args)
    device = torch.device(args.device)
    if args.compile:
        return [compiled_table(args, device)]
    return [baby_gpt_table(args, device), quick_start_table(args, device)]


# ------------------------------------------------- --one_thread: CPU seconds, nanoGPT's own sample.py

NANOGPT_BABY = dict(BABY_GPT, pos_encoding="learned", norm="layernorm", mlp="gelu_exact", tie_embeddings=True)


def save_nanogpt_baby(folder, seed, **shape):
    """The baby GPT (random weights; `shape` overrides) saved in nanoGPT's checkpoint layout, which
    both nanoGPT's sample.py and ours load: our GPT with nanoGPT's architecture has its names."""
    from model import GPT, GPTConfig

    torch.manual_seed(seed)
    config = {**NANOGPT_BABY, **shape}
    model = GPT(GPTConfig(**config))
    args = {k: config[k] for k in ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size", "dropout")}
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model.state_dict(), "model_args": args, "iter_num": 0, "best_val_loss": 0.0,
                "config": {"dataset": "shakespeare_char"}}, folder / "ckpt.pt")
    return model


def write_char_meta(path, chars):
    import pickle

    with open(path, "wb") as f:  # nanoGPT's meta.pkl: plain dicts, read back by our safe unpickler
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": {c: i for i, c in enumerate(chars)}}, f)


def measure_floor_rates():
    """(read bandwidth in bytes/s, fp32 matmul FLOP/s) of one thread, measured here in
    CPU seconds of this thread (as the per-token costs are), best of 5 bursts."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    big = torch.ones(64 * 1024 * 1024)  # 256 MB: far larger than any cache
    a = torch.randn(512, 512)
    bandwidth = flops = 0.0
    try:
        big.sum(), a @ a
        for _ in range(5):
            t0 = time.thread_time()
            big.sum()
            bandwidth = max(bandwidth, big.numel() * 4 / (time.thread_time() - t0))
            t0 = time.thread_time()
            for _ in range(10):
                a @ a
            flops = max(flops, 10 * 2 * 512**3 / (time.thread_time() - t0))
    finally:
        torch.set_num_threads(threads)
    return bandwidth, flops


def floor_ms(n_params, rows, bandwidth, flops):
    """Least ms per new token: every fp32 weight read once per step (shared by `rows`
    rows), or 2 FLOPs per weight per token, whichever takes longer."""
    return 1000 * max(4 * n_params / rows / bandwidth, 2 * n_params / flops)


def per_token_cpu(run_n, run_1, n):
    """CPU ms per new token from runs of n and of 1 new token (start-up cancels)."""
    return 1000 * (run_n - run_1) / (n - 1)


def one_thread_tables(args):
    """The --one_thread tables, from a temporary folder (the baby GPT's 43 MB checkpoint, the
    logs, an inductor cache) that is removed afterwards, however the run ends."""
    import shutil
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="bench-sample-"))
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    try:
        return one_thread_tables_in(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if cache is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache


def one_thread_tables_in(args, work):
    import sys

    from benchmarks import one_thread
    from benchmarks.report import Table

    nano = one_thread.nanogpt_dir(args.nanogpt)
    quick_start_checkpoint(args.out_dir)  # the second table needs it: say so before minutes of the first
    n = 40 if args.quick else args.new_tokens
    reps = 1 if args.quick else args.repeats
    bandwidth, flops = measure_floor_rates()
    model = save_nanogpt_baby(work / "baby", args.seed)
    n_params = sum(p.numel() for p in model.parameters())
    if nano is not None:
        meta = one_thread.nanogpt_char_data(nano) / "meta.pkl"
    else:
        meta = work / "meta.pkl"
        write_char_meta(meta, [chr(c) for c in range(32, 97)])
    ours = [sys.executable, "sample.py", "--ckpt", str(work / "baby" / "ckpt.pt"), "--meta", str(meta),
            "--device", "cpu", "--dtype", "float32", "--num_samples", "1", "--seed", str(args.seed)]
    commands = {}
    if nano is not None:
        commands["nanoGPT's sample.py"] = (nano, [sys.executable, "sample.py", f"--out_dir={work / 'baby'}", "--device=cpu",
                                                  "--dtype=float32", "--num_samples=1", f"--seed={args.seed}"], "--max_new_tokens={}")
    if not args.no_exact:
        commands["ours, exact (--shift_context false)"] = (REPO, ours + ["--shift_context", "false"], "--max_new_tokens={}")
    commands["ours, default (KV cache + shift_context)"] = (REPO, ours, "--max_new_tokens={}")
    commands["ours, nn.Linear (--cpu_decode false)"] = (REPO, ours + ["--cpu_decode", "false"], "--max_new_tokens={}")
    for dtype in ("float16", "int8"):  # fewer bytes a token: float16 or int8 copies of the matrices
        weights = [dtype if arg == "float32" else arg for arg in ours]
        commands[f"ours, --dtype {dtype}"] = (REPO, weights, "--max_new_tokens={}")
    if getattr(args, "before", None):  # the same rows from another checkout, interleaved with ours
        before = Path(args.before).expanduser().resolve()
        if not (before / "sample.py").is_file():
            raise UserError(f"--before {before}: no sample.py there (a checkout of this project)")
        for dtype in ("float32", "float16", "int8"):
            weights = [dtype if arg == "float32" else arg for arg in ours]
            commands[f"before ({before.name}), --dtype {dtype}"] = (before, weights, "--max_new_tokens={}")
    # compiled: its 1-token run pays the compile, so the difference of the two cancels it (reported apart)
    commands["ours, --compile"] = (REPO, ours + ["--compile", "true"], "--max_new_tokens={}")
    cpu = {label: {n: [], 1: []} for label in commands}
    wall = {label: [] for label in commands}
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(work / "inductor-cache")  # starts empty: the first compile is cold
    cwd, command, flag = commands["ours, --compile"]
    cold = one_thread.run_one_thread(command + [flag.format(1)], cwd, work / "logs" / "compile-cold.log")["cpu_s"]
    for rep in range(reps):  # A B A B: load changes hit every row alike
        for count in (n, 1):
            for label, (cwd, command, flag) in commands.items():
                r = one_thread.run_one_thread(command + [flag.format(count)], cwd, work / "logs" / f"{len(cpu[label][count])}-{count}.log")
                cpu[label][count].append(r["cpu_s"])
                if count == n:
                    wall[label].append(r["wall_s"])
    floor = floor_ms(n_params, 1, bandwidth, flops)
    base_label = next(iter(commands))
    base_ms = per_token_cpu(min(cpu[base_label][n]), min(cpu[base_label][1]), n)
    table = Table(
        f"Sampling at one thread, CPU seconds: baby GPT (6x6x384, block 256, fp32), batch 1, {n:,} new tokens",
        ["sampler", "process CPU s (n tokens)", "process CPU s (1 token)", "CPU ms/token", "tokens/CPU s",
         f"vs {base_label}", "floor ms/token", "of floor", "wall s"],
        note=f"Each row: `{' '.join(ours[1:2])} ...` run as a subprocess with OMP_NUM_THREADS=1, best of {reps} "
        f"interleaved runs; per-token cost = (CPU s for {n} tokens - CPU s for 1 token) / {n - 1}, so start-up "
        f"(imports, loading) cancels. Floor: {4 * n_params / 1e6:.1f} MB of fp32 weights read once per token at "
        f"{bandwidth / 1e9:.1f} GB/s (one thread, measured), or 2 FLOPs per weight at {flops / 1e9:.1f} GFLOP/s "
        "(512x512 fp32 matmul, one thread), whichever is slower. Random weights, temperature 0.8, top_k 200 "
        "(sample.py's defaults in both).",
    )
    for label in commands:
        ms = per_token_cpu(min(cpu[label][n]), min(cpu[label][1]), n)
        table.add_row(label, round(min(cpu[label][n]), 2), round(min(cpu[label][1]), 2), round(ms, 3), round(1000 / ms, 1),
                      f"{base_ms / ms:.1f}x", round(floor, 3), f"{100 * floor / ms:.0f}%", round(min(wall[label]), 1))
    default = "ours, default (KV cache + shift_context)"
    table.note += (" Ours by default runs model.py's forward with gptkit/fast/cpu_linears.py's NumPyLinear parts on a CPU. "
                   f"--compile (the PyTorch step compiled): its compile costs the 1-token run's extra CPU s over the default's: "
                   f"{cold - min(cpu[default][1]):.1f} s with an empty inductor cache, "
                   f"{min(cpu['ours, --compile'][1]) - min(cpu[default][1]):.1f} s in a later process "
                   "(inductor's on-disk cache of the compiled graph warm).")
    tables = [table]
    tables.append(one_thread_batched_table(args, work, bandwidth, flops))
    return tables


def quick_start_checkpoint(out_dir):
    from gptkit.models import loading

    try:
        return loading.find_checkpoint(out_dir)
    except UserError:
        raise UserError(f"no quick-start model in {out_dir}: train one with `python train.py configs/shakespeare.py` first")


def one_thread_batched_table(args, work, bandwidth, flops):
    """sample.py's default (10 samples x 500 tokens, one batch) on the quick-start model, one thread."""
    import sys

    from benchmarks import one_thread
    from benchmarks.report import Table

    num, n = (2, 40) if args.quick else (10, 500)
    path = quick_start_checkpoint(args.out_dir)
    model, _, source = quick_start_model(args.out_dir)
    n_params = sum(p.numel() for p in model.parameters())
    base = [sys.executable, "sample.py", "--ckpt", str(path), "--device", "cpu", "--num_samples", str(num),
            "--seed", str(args.seed), "--start", "ROMEO:"]
    rows = {"no cache: recompute the context (--use_cache false)": base + ["--use_cache", "false"],
            "sample.py's default (KV cache + shift_context)": base}
    cpu = {label: {n: [], 1: []} for label in rows}
    for rep in range(1 if args.quick else args.repeats):
        for count in (n, 1):
            for label, command in rows.items():
                r = one_thread.run_one_thread(command + ["--max_new_tokens", str(count)], REPO,
                                              work / "logs" / f"qs-{len(cpu[label][count])}-{count}.log")
                cpu[label][count].append(r["cpu_s"])
    floor = floor_ms(n_params, num, bandwidth, flops)
    table = Table(
        f"Sampling at one thread, CPU seconds: sample.py, {num} samples x {n} tokens as one batch, quick-start model",
        ["sampler", "CPU ms/token", "tokens/CPU s", "vs no cache", "floor ms/token", "of floor"],
        note=f"{source}. Per token = (CPU s for {n} tokens - CPU s for 1) / ({n - 1} x {num} rows); one thread, "
        f"best of the interleaved runs. Floor: weights read once per step for {num} rows, or 2 FLOPs per weight per token.",
    )
    first = None
    for label in rows:
        ms = per_token_cpu(min(cpu[label][n]), min(cpu[label][1]), n) / num
        first = first or ms
        table.add_row(label, round(ms, 3), round(1000 / ms, 1), f"{first / ms:.1f}x", round(floor, 4), f"{100 * floor / ms:.0f}%")
    return table
