"""Every product route tried for generating on a CPU, on GPT-2 124M's matrices (random
weights) at one row of inputs and one thread: microseconds per product for the four
block shapes (cycling through 12 layers' distinct matrices, as a token's step does,
so each is read from memory) and the 768x50257 head, and ms for a token's 49.

    OMP_NUM_THREADS=1 python benchmarks/product_routes.py    # from the repository root

Prints a Markdown table (BENCHMARKS.md keeps the latest, benchmarks/LOG.md each run).
"""

import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gptkit.fast import cpu_linears
from gptkit.fast import int8_kernel  # noqa: E402

SHAPES = [("c_attn", 2304, 768), ("attn c_proj", 768, 768), ("c_fc", 3072, 768), ("mlp c_proj", 768, 3072)]


def int8_rows(w):  # cpu_linears' rounding, the matrix laid out row by row
    q, scale = cpu_linears.int8_rows(w)
    return q.contiguous(), scale


def int_mm(x, prepared):  # torch._int_mm: the inputs rounded to int8 per row as well
    q_t, scale = prepared
    x_scale = x.abs().amax(1, keepdim=True) / 127
    return torch._int_mm(torch.round(x / x_scale).to(torch.int8), q_t) * (x_scale * scale)


@torch.compile(dynamic=False)
def reduction(x, q, scale):  # inductor writes this as one C++ loop
    return (x * q.to(torch.float32)).sum(-1) * scale


def int8_kernel_part(w):
    linear = nn.Linear(w.shape[1], w.shape[0], bias=False)
    linear.weight = nn.Parameter(w)
    return cpu_linears.Int8Linear(linear, kernel=int8_kernel.load()[0])


ROUTES = {
    "F.linear float32": (lambda w: w, F.linear),
    "NumPy x @ W (W laid out transposed)": (lambda w: w.t().contiguous().numpy(), lambda x, w: x.numpy() @ w),
    "F.linear float16 (float16 inputs)": (lambda w: w.half(), lambda x, w: F.linear(x.half(), w).float()),
    "F.linear bfloat16": (lambda w: w.bfloat16(), lambda x, w: F.linear(x.bfloat16(), w).float()),
    "torch._weight_int8pack_mm, bfloat16 inputs": (
        lambda w: (int8_rows(w)[0], int8_rows(w)[1].bfloat16()),
        lambda x, p: torch._weight_int8pack_mm(x.bfloat16(), *p).float()),
    "torch._int_mm, int8 inputs per row": (lambda w: (int8_rows(w)[0].t(), int8_rows(w)[1]), int_mm),
    "torch.compile'd reduction (x * q.float()).sum(-1) * s": (int8_rows, lambda x, p: reduction(x, *p)),
}


def fastest(f, repeats=5):
    times = []
    for _ in range(repeats):
        start = time.process_time()
        f()
        times.append(time.process_time() - start)
    return min(times)


@torch.no_grad()
def main():
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    weights = [[torch.randn(o, i, generator=generator) * 0.02 for _, o, i in SHAPES] for _ in range(12)]
    head = torch.randn(50257, 768, generator=generator) * 0.02
    inputs = {768: torch.randn(1, 768), 3072: torch.randn(1, 3072)}
    routes = dict(ROUTES)
    kernel, why_not = int8_kernel.load()
    if kernel is None:
        print(f"gptkit/fast/int8_kernel.c left out: {why_not}", file=sys.stderr)
    else:
        routes["gptkit/fast/int8_kernel.c (VNNI), int8 inputs per row"] = (int8_kernel_part, lambda x, part: part(x))
    print("| route | ms a token | " + " | ".join(name for name, _, _ in SHAPES) + " | head |")
    print("|---|---|" + "---|" * (len(SHAPES) + 1))
    for name, (prepare, run) in routes.items():
        layers = [[prepare(w) for w in ws] for ws in weights]
        head_p = prepare(head)

        def block(j):
            return [run(inputs[SHAPES[j][2]], layer[j]) for layer in layers]

        def token():
            return [block(j) for j in range(4)], run(inputs[768], head_p)

        token()  # compiles where it must
        per_shape = [fastest(lambda: block(j)) / 12 * 1e6 for j in range(4)]
        head_us = fastest(lambda: run(inputs[768], head_p)) * 1e6
        print(f"| {name} | {fastest(token) * 1e3:.2f} | " + " | ".join(f"{us:,.0f}" for us in per_shape)
              + f" | {head_us:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
