"""Generation speed: new tokens per second with and without the key/value cache.

    python bench.py sample            # both tables below (the no-cache runs take minutes)
    python bench.py sample --quick    # a smoke test: a few dozen tokens each

Table 1 (issue 4): nanoGPT's baby GPT shape (6 layers, 6 heads, 384 wide, block
256, 65-character vocabulary; random weights, since speed does not depend on
them), batch 1, 1,000 new tokens. Table 2 (issue 6): what `python sample.py`
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
"""

import copy
import dataclasses
import time

import torch

from gptkit.errors import UserError

BABY_GPT = dict(n_layer=6, n_head=6, n_embd=384, block_size=256, vocab_size=65, bias=False, dropout=0.0)
QUICK_START_CONFIG = "configs/shakespeare.py"
MODES = [  # (row label, use_cache, shift_context)
    ("no cache: recompute the context (nanoGPT)", False, False),
    ("KV cache (same tokens as recomputing)", True, False),
    ("KV cache + shift_context (sample.py's default)", True, True),
]


def add_arguments(parser):
    parser.add_argument("--quick", action="store_true", help="a smoke test: a few dozen tokens per run")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, ... (default cpu)")
    parser.add_argument("--out_dir", default="out-shakespeare", help="where the quick-start model is looked for")
    parser.add_argument("--seed", type=int, default=1337)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_stream(model, idx, n, use_cache, shift_context, device, seed):
    """Seconds to generate n tokens per row of idx, after a short warm-up."""
    generator = torch.Generator(device=device).manual_seed(seed)
    options = dict(temperature=1.0, generator=generator, use_cache=use_cache, shift_context=shift_context)
    for _ in model.generate_stream(idx, 2, **options):  # warm-up: allocator, thread pool
        pass
    sync(device)
    t0 = time.perf_counter()
    count = 0
    for _ in model.generate_stream(idx, n, **options):
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
        "Generation, baby GPT shape (6x6x384, block 256), batch 1 (issue 4)",
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
    from gptkit import loading
    from gptkit.checkpoint import load_checkpoint
    from gptkit.config import read_config_file
    from model import GPT, GPTConfig
    from gptkit.tokenizer import CharTokenizer

    try:
        path = loading.find_checkpoint(out_dir)
    except UserError:
        path = None
    if path is not None:
        model, tokenizer, summary = loading.model_from_checkpoint(load_checkpoint(path), path)
        return model, tokenizer, summary
    fields = {f.name for f in dataclasses.fields(GPTConfig)}
    try:
        shape = {k: v for k, v in read_config_file(QUICK_START_CONFIG).items() if k in fields}
    except UserError:
        shape = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, bias=False)
    chars = [chr(c) for c in range(32, 97)]  # 65 characters, Tiny Shakespeare's vocabulary size
    shape.update(vocab_size=len(chars), dropout=0.0)
    model = GPT(GPTConfig(**shape)).eval()
    return model, CharTokenizer(chars), f"no trained model in {out_dir}: {QUICK_START_CONFIG}'s shape, random weights"


def quick_start_table(args, device):
    import sample
    from benchmarks.report import Table
    from gptkit import generate

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
        f"sample.py: {num_samples} samples of {n} tokens as one batch, quick-start model (issue 6)",
        ["generation", "new tokens", "seconds", "tokens/s", "vs no cache"],
        note=f"{source}. Shape {config.n_layer}x{config.n_head}x{config.n_embd}, block {config.block_size}; "
        f"device {device}; through generate.generate_samples (decoding included).",
    )
    add_rows(table, timings, num_samples * n)
    return table


def run(args):
    device = torch.device(args.device)
    return [baby_gpt_table(args, device), quick_start_table(args, device)]
