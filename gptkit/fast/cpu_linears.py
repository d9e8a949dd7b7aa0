"""Faster matrix products for generating on a CPU, swapped into model.py's built model.

    python sample.py --start "ROMEO:"                  # a CPU in float32: NumPyLinear
    python sample.py --start "ROMEO:" --dtype float16  # Float16Linear
    python sample.py --start "ROMEO:" --dtype int8     # Int8Linear
    python sample.py --start "ROMEO:" --cpu_decode false  # model.py's nn.Linear as written

Generating one token reads every weight of the model once and does little arithmetic
with each: on a CPU the step is bound by how fast the matrices are read, and most of
its time is in the products of the model's nn.Linear layers. sample.py, its --chat
mode and serve.py run model.py's own forward with its KV cache (one network: an
edit to model.py always runs); only the modules whose type is exactly nn.Linear
(whose forward is F.linear(x, weight, bias), nothing else) are replaced, once,
after the model is built, by one of these (gpt-fast's quantize.py does the same
with its WeightOnlyInt8Linear):

    NumPyLinear    float32, the same weight: x @ Wᵀ with NumPy's BLAS, which reads a
                   matrix faster than PyTorch's product for one row (BENCHMARKS.md)
    Float16Linear  a float16 copy of W and float16 inputs: half the bytes a token
    Int8Linear     W rounded to int8 per output row (w = scale * q, |q| <= 127), a quarter
                   of the bytes: at one thread on AVX2 or VNNI, inputs rounded to int8 per
                   row and gptkit/fast/int8_kernel.c's int32 sums; else bfloat16 inputs and
                   torch._weight_int8pack_mm

Each keeps the replaced module's weight and bias (the same Parameters: a tied
embedding, a state_dict or code reading `.weight` see what they saw), falls back to
F.linear where a gradient is wanted, and is checked before it goes in: on random
inputs its output must equal the module's to within its format's rounding (TOLERANCE,
relative). One that does not, or whose format cannot hold the weight (an infinity;
float16 past 65504), stays nn.Linear, and one line says so. `swap_linears` returns
what was swapped, for the header sample.py and serve.py print.
"""

import contextlib
import functools

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptkit.fast import int8_kernel
from gptkit.ops.device import F16_OVERFLOW

# ||swapped(x) - linear(x)|| / ||linear(x)|| allowed by the check, per format: float32
# rounding; float16 inputs and weights (2**-11 each); bfloat16 inputs (2**-8) and int8
# weights (up to half a step of max|row| / 127 each).
TOLERANCE = {"float32": 1e-5, "float16": 5e-3, "int8": 3e-2}
NEEDED_OPS = {"int8": "_weight_int8pack_mm"}  # torch.<name>, checked by available()
INT8_INPUTS_MULTIPLE = 16  # _weight_int8pack_mm reads the inputs in blocks of 16 (others: garbage, or a crash)


def plain_input(x):
    """Whether x can take the fast product: a float32 CPU tensor no gradient flows into."""
    return x.dtype == torch.float32 and x.device.type == "cpu" and not (torch.is_grad_enabled() and x.requires_grad)


@torch.no_grad()
def transposed_in_place(weight):
    """The (in, out) NumPy array of a weight (out, in), after laying the Parameter out
    transposed in place: the same values and Parameter, no second copy, and x @ W reads
    it row by row (measured faster than x @ Wᵀ's column order in a whole step)."""
    if not weight.t().is_contiguous():
        weight.data = weight.data.t().contiguous().t()
    return weight.detach().t().numpy()


class NumPyLinear(nn.Module):
    """x @ Wᵀ + b with NumPy on the same float32 weight (shared memory, no copy)."""

    def __init__(self, linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.w = transposed_in_place(linear.weight)  # (in, out), the Parameter's own memory

    def forward(self, x):
        if not plain_input(x):
            return F.linear(x, self.weight, self.bias)
        rows = x.reshape(-1, x.size(-1)).detach().numpy()  # (N, in)
        y = torch.from_numpy(rows @ self.w)  # (N, out)
        if self.bias is not None:
            y += self.bias.detach()
        return y.view(*x.shape[:-1], y.size(-1))


class Float16Linear(nn.Module):
    """x @ Wᵀ + b with W and x rounded to float16 (the product's sums in float32 inside
    the kernel), the result back in float32: half the bytes of W read each token."""

    def __init__(self, linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.register_buffer("w16", linear.weight.detach().half(), persistent=False)  # (out, in)

    def forward(self, x):
        if not plain_input(x):
            return F.linear(x, self.weight, self.bias)
        y = F.linear(x.half(), self.w16).float()
        return y if self.bias is None else y + self.bias


def int8_rows(weight):
    """W (out, in) as int8 q and float32 scale (out,) with W ≈ scale[:, None] * q: each row's
    scale max |row| / 127 (1 for a row of zeros), q = round(W / scale)."""
    scale = weight.abs().amax(dim=1) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(weight / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


class Int8Linear(nn.Module):
    """x @ Wᵀ + b with W rounded to int8 per output row: a quarter of float32's bytes.
    Given gptkit/fast/int8_kernel.c's library (one thread, a CPU with AVX2 or VNNI), x is
    rounded to int8 per row too and the int8 sums run in int32 there; without it x is
    rounded to bfloat16 and torch._weight_int8pack_mm multiplies (PyTorch's threads); it
    reads the inputs in blocks of 16, so a width that is not a multiple of 16 gets zero
    columns in q and zeros after each input row (each adds 0 * 0 to every sum)."""

    def __init__(self, linear, kernel=None, product="torch._weight_int8pack_mm"):
        super().__init__()
        self.product = product  # the header's words for what multiplies
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        q, scale = int8_rows(linear.weight.detach())
        self.padding = 0 if kernel is not None else -self.in_features % INT8_INPUTS_MULTIPLE
        # (out, in) int8; (out, in + padding) for torch._weight_int8pack_mm
        self.register_buffer("q", F.pad(q, (0, self.padding)).contiguous(), persistent=False)
        self.kernel = kernel
        # (out,): float32 for int8_linear, bfloat16 for torch._weight_int8pack_mm
        self.register_buffer("scale", scale.float() if kernel else scale.bfloat16(), persistent=False)
        if kernel is not None:  # int8_linear also reads each row's sum of q
            self.register_buffer("qsum", q.sum(dim=1, dtype=torch.int32), persistent=False)
            # The C call's tensors, as it reads them, gathered once: a call's Python work is
            # much of a small product's time (a plain attribute, not Module's buffer lookup).
            bias = None if linear.bias is None else linear.bias.detach().float().contiguous()
            self.c_arguments = (self.q, self.scale, self.qsum, bias)

    def forward(self, x):
        if not plain_input(x):
            return F.linear(x, self.weight, self.bias)
        if self.kernel is not None:
            return self.kernel_product(x)
        rows = F.pad(x.reshape(-1, x.size(-1)).bfloat16(), (0, self.padding))  # (N, in + padding)
        y = torch._weight_int8pack_mm(rows, self.q, self.scale).float()  # (N, out)
        y = y.view(*x.shape[:-1], y.size(-1))
        return y if self.bias is None else y + self.bias

    def kernel_product(self, x):
        """int8_kernel.c's int8_linear on x (..., in) float32: (..., out), the bias added."""
        x = x.contiguous()
        y = x.new_empty(*x.shape[:-1], self.out_features)
        q, scale, qsum, bias = (None if t is None else t.data_ptr() for t in self.c_arguments)
        if self.kernel.int8_linear(x.data_ptr(), x.numel() // self.in_features, self.in_features,
                                   q, scale, qsum, bias, self.out_features, y.data_ptr()):
            raise MemoryError("gptkit/fast/int8_kernel.c: no memory for the inputs rounded to int8")
        return y


PARTS = {"float32": NumPyLinear, "float16": Float16Linear, "int8": Int8Linear}


def available(weights):
    """None if this PyTorch has what `weights`'s part needs, else the missing operation's name."""
    name = NEEDED_OPS.get(weights)
    return None if name is None or hasattr(torch, name) else f"torch.{name}"


def unfit(weights, weight):
    """Why `weights`'s format cannot hold this weight, or None."""
    if not torch.isfinite(weight).all():
        return "it holds a non-finite value"
    if weights == "float16" and weight.abs().max().item() >= F16_OVERFLOW:
        return f"it holds {weight.abs().max().item():.6g}, past float16's largest value 65504"
    return None


@torch.no_grad()
def check(part, linear, weights):
    """Why `part` does not compute what `linear` computes, or None: random inputs of a
    token and of a prompt, compared to TOLERANCE relative (a NaN fails)."""
    generator = torch.Generator().manual_seed(0)
    for shape in ((1, 1, linear.in_features), (2, 3, linear.in_features)):
        x = torch.randn(shape, generator=generator)
        expected, got = linear(x), part(x)
        if got.shape != expected.shape:
            return f"its output is {tuple(got.shape)}, not {tuple(expected.shape)}"
        gap = ((got - expected).norm() / expected.norm().clamp_min(1e-30)).item()
        if not gap <= TOLERANCE[weights]:
            return f"its output differs by {gap:.3g} of the product's size (allowed {TOLERANCE[weights]})"
    return None


def linears(model):
    """(parent module, attribute name, full name, module) of every module of type exactly nn.Linear."""
    for parent_name, parent in model.named_modules():
        for name, child in parent.named_children():
            if type(child) is nn.Linear:
                yield parent, name, f"{parent_name}.{name}".lstrip("."), child


def int8_product():
    """(gptkit/fast/int8_kernel.c's library or None, the header's words for the int8 products):
    the kernel at one thread where it builds, else torch._weight_int8pack_mm."""
    if torch.get_num_threads() != 1:
        threads = torch.get_num_threads()
        return None, f"torch._weight_int8pack_mm on {threads} threads (gptkit/fast/int8_kernel.c runs on one)"
    kernel, why_not = int8_kernel.load()
    if kernel is None:
        return None, f"torch._weight_int8pack_mm (gptkit/fast/int8_kernel.c not used: {why_not})"
    return kernel, f"gptkit/fast/int8_kernel.c on one thread ({kernel.isa})"


def swap_linears(model, weights, note):
    """Replace every nn.Linear of `model` (float32, on a CPU) by PARTS[weights], each
    checked first; `note(line)` hears, in one line, of those kept as they were. Returns
    [(name, parent, attribute, the replaced nn.Linear)] for restore_linears, also kept
    as model.swapped_linears."""
    swapped, kept = [], {}
    make, kernel = PARTS[weights], None
    if weights == "int8":
        kernel, product = int8_product()
        make = functools.partial(Int8Linear, kernel=kernel, product=product)
    for parent, attr, name, linear in list(linears(model)):
        why = unfit(weights, linear.weight)
        part = None if why else make(linear)
        why = why or check(part, linear, weights)
        if why:
            kept.setdefault(why, []).append(name)
            continue
        setattr(parent, attr, part)
        swapped.append((name, parent, attr, linear))
    if kept:
        reasons = "; ".join(f"{', '.join(names)}: {why}" for why, names in kept.items())
        note(f"decode: {sum(map(len, kept.values()))} nn.Linear stay model.py's ({PARTS[weights].__name__}, "
             f"{reasons})")
    model.swapped_linears = swapped  # what as_written puts back for checks of model.py's own forward
    return swapped


def restore_linears(swapped):
    """Put back the nn.Linear modules swap_linears replaced."""
    for _, parent, attr, linear in swapped:
        setattr(parent, attr, linear)


@contextlib.contextmanager
def as_written(model):
    """model.py's own nn.Linear modules in place of the parts swapped into `model` (its
    `swapped_linears`, recorded by swap_linears) while the block runs, the
    parts again after: for checks of model.py's forward itself (its cache, its batching),
    which the parts' rounding must not sway. An int8 part rounds each row of inputs to
    int8, so a float rounding apart in two ways of computing the same row can move a value
    by one int8 step: GPT-2 124M's logits through the cache then differ from the whole
    context's by ~2% where model.py's own differ by ~1e-6."""
    swapped = model.__dict__.get("swapped_linears") or []
    parts = [getattr(parent, attr) for _, parent, attr, _ in swapped]
    restore_linears(swapped)
    try:
        yield model
    finally:
        for (_, parent, attr, _), part in zip(swapped, parts):
            setattr(parent, attr, part)
