"""One-token decoding on a CPU in float32, written with NumPy: what sample.py runs there by default.

    python sample.py --start "ROMEO:"                    # on a CPU: this step for every new token
    python sample.py --start "ROMEO:" --cpu_decode false  # model.py's forward in PyTorch instead

Generating one sample, each new token reads every weight of the model once and
does little arithmetic with it: the step is bound by memory bandwidth plus a fixed
cost per operation. Measured on our 2-core CPU (benchmarks/LOG.md), PyTorch's
matrix-vector products (MKL) read the weights at ~60% of the bandwidth a plain sum
reaches, and each of the ~150 small operations of a step costs several
microseconds of dispatch; NumPy's BLAS reads them at the bandwidth, and its
operations cost about a microsecond. So this file runs model.py's computation for
one new token with NumPy arrays that share memory with the model's tensors:

- the same weights, no copy: each Linear's weight is laid out transposed in place
  (W.t().contiguous().t(), the same values; PyTorch reads it as before), so that
  x @ Wᵀ streams it row by row;
- the same KV cache (model.py's KVCache): the prompt runs through model.py, which
  fills it; each token's keys and values are then written into it here;
- the same formulas, in model.py's order, for every GPTConfig variant (positions,
  norms and their placement, MLPs, QK-norm, grouped-query heads, the soft-cap).
  The norms and GELUs are model.py's own calls (F.layer_norm, F.rms_norm, F.gelu)
  on the same memory: one PyTorch call costs less than the NumPy operations it replaces.

With `--dtype float16` on a CPU (`round_to_float16`, then `CPUDecoder(model,
float16=True)`), every parameter is rounded to its nearest float16 value, kept in
float32, and the step's matrix products read a float16 copy of the matrices
(fbgemm's fp16 GEMM, `torch.ops.quantized.linear_dynamic_fp16`: the weights
widened to float32 as they are read, the arithmetic in float32): half the bytes per
token, the same values as model.py computes with the rounded weights (the prompt
runs there). Where this PyTorch has no fbgemm (ARM CPUs), the products stay NumPy's
float32 ones on the rounded weights: the same numbers, not faster.

With `--dtype int8` on a CPU (`round_to_int8`, then `CPUDecoder(model,
weights="int8")`), every matrix a token's step multiplies by (each block's four
Linears and the output layer) is rounded to int8 per output row (w = scale * q, q in
[-127, 127], scale = max |row| / 127), kept in float32, and the products after the
checked steps are fbgemm's int8 ones (`torch.ops.quantized.linear_dynamic`: the
packed int8 weight, ~0.26x the float32 bytes, times the input quantized to 7 bits
per call, int32 sums): the weights are exactly the rounded ones model.py sees, the
inputs of each product are rounded on top (~1% of a product's size). The checked
steps run NumPy's float32 products on the same rounded weights, so they check this
file's formulas against model.py as before; the int8 products themselves are
tested against float32 in tests/test_cpu_decode.py (top-1 agreement and a logit
tolerance) and their loss cost is measured by `bench.py gpt2_cpu`. Without fbgemm
the products stay NumPy's float32 ones on the rounded weights.

A guest of model.py, not a second copy of it: the first CHECKED_STEPS one-token
steps of every generation run both ways, model.py's forward with the same cache
first, then this step (whose keys and values then stand, as always), and their
logits must agree to rounding (TOLERANCE of the largest logit). Where they do not
(model.py edited: a learner's change to an MLP, a norm, attention), model.py's
logits are used, one line on stderr says so, and model.py runs every later token.
Measured cost: 3 extra one-token forwards per sample (benchmarks/LOG.md).

tests/test_cpu_decode.py checks the logits against model.py's to 2e-5 for each
variant (float16 weights included) and the sampled text against the PyTorch path.
Anything else (a GPU, bfloat16, torch.compile) runs model.py as it is.
"""

import math
import sys
import warnings

import numpy as np
import torch
import torch.nn.functional as F

from gptkit.device import F16_OVERFLOW
from gptkit.errors import UserError
from model import NORM_EPS, KVCache

CHECKED_STEPS = 3  # one-token steps checked against model.py at the start of every generation
TOLERANCE = 1e-4  # of max(1, the largest |logit|): float32 rounding is ~1e-6 of it here


def applies(model, device):
    """Whether this decoder runs for `model` on `device`: a CPU, float32 weights."""
    return device.type == "cpu" and model.lm_head.weight.dtype == torch.float32


def has_fbgemm():
    """Whether this PyTorch has fbgemm's float16- and int8-weight products (x86 builds)."""
    return "fbgemm" in torch.backends.quantized.supported_engines


@torch.no_grad()
def round_to_float16(model):
    """Round every parameter of `model` (float32, in place) to its nearest float16 value:
    the weights `--dtype float16` decodes with on a CPU. A finite value beyond float16's
    range would become infinity: refused, naming the parameter."""
    for name, p in model.named_parameters():
        largest = p.detach().abs().max().item() if p.numel() else 0.0
        if largest >= F16_OVERFLOW:
            raise UserError(f"--dtype float16: {name} holds {largest:.6g}, beyond float16's largest value 65504; "
                            f"use --dtype float32 or bfloat16")
    for p in model.parameters():
        p.copy_(p.half().float())


def int8_linears(model):
    """The matrices a one-token step multiplies by: each block's four Linears, the output layer."""
    for block in model.transformer.h:
        yield from (block.attn.c_attn, block.attn.c_proj, block.mlp.c_fc, block.mlp.c_proj)
    yield model.lm_head


def int8_scales(weight):
    """Per output row: max |row| / 127 (1 for a row of zeros, whose q is 0 at any scale)."""
    scale = weight.abs().amax(dim=1) / 127
    return torch.where(scale > 0, scale, torch.ones_like(scale))


@torch.no_grad()
def round_to_int8(model):
    """Round every matrix of `int8_linears(model)` (float32, in place) to int8 per output
    row, kept as float32 values (scale * q): the weights `--dtype int8` decodes with on a
    CPU. A tied embedding is the output layer's weight, so it is rounded too. A
    non-finite weight has no int8 scale: refused, naming the matrix."""
    names = {id(p): name for name, p in model.named_parameters()}
    for linear in int8_linears(model):
        w = linear.weight
        if not torch.isfinite(w).all():
            raise UserError(f"--dtype int8: {names.get(id(w), 'a weight')} holds a non-finite value; "
                            "use --dtype float32")
        scale = int8_scales(w)[:, None]
        w.copy_(torch.round(w / scale).clamp_(-127, 127) * scale)


def transposed_in_place(linear):
    """The (in, out) NumPy array of linear.weight, after laying the weight out transposed
    in place (once): the same values, the same Parameter, no second copy."""
    w = linear.weight
    if not w.t().is_contiguous():
        with torch.no_grad():
            w.data = w.data.t().contiguous().t()
    return w.detach().t().numpy()  # (in, out), C-contiguous


def as_array(tensor):
    return None if tensor is None else tensor.detach().numpy()


def detached(tensor):
    return None if tensor is None else tensor.detach()


def norm_arrays(norm):
    """(kind, weight, bias) of a LayerNorm or RMSNorm module, as tensors for normalize()."""
    kind = "layer" if isinstance(norm, torch.nn.LayerNorm) else "rms"
    return kind, detached(norm.weight), detached(norm.bias)


def normalize(x, kind, weight, bias):
    """model.py's norms on the last axis, LayerNorm (x - mean) / std or RMSNorm x / rms:
    the same PyTorch call on the same memory (one call costs less than NumPy's five)."""
    t = torch.from_numpy(x)
    if kind == "layer":
        return F.layer_norm(t, (t.size(-1),), weight, bias, NORM_EPS).numpy()
    t = F.rms_norm(t, (t.size(-1),), weight, NORM_EPS)
    return (t if bias is None else t + bias).numpy()


def gelu_tanh(h):  # model.py's nn.GELU(approximate="tanh"), on the same memory
    return F.gelu(torch.from_numpy(h), approximate="tanh").numpy()


def gelu_exact(h):  # nn.GELU(): the erf form
    return F.gelu(torch.from_numpy(h)).numpy()


def relu2(h):
    h = np.maximum(h, 0.0)
    return h * h


ACTIVATIONS = {"gelu": gelu_tanh, "gelu_exact": gelu_exact, "relu2": relu2}


def rotate(x, cos, sin):
    """apply_rope for one position: pairs (x[i], x[i + D/2]) turned by their angles."""
    x1, x2 = np.split(x, 2, axis=-1)
    return np.concatenate((x1 * cos - x2 * sin, x1 * sin + x2 * cos), axis=-1)


def numpy_product(linear):
    """x (B, in) -> x Wᵀ + b: NumPy streaming the float32 weight laid out transposed in place."""
    w, b = transposed_in_place(linear), as_array(linear.bias)
    return (lambda x: x @ w) if b is None else (lambda x: x @ w + b)


def float16_product(linear):
    """The same product reading a float16 copy of the weight (fbgemm packs it once)."""
    packed = torch.ops.quantized.linear_prepack_fp16(linear.weight.detach().contiguous(), detached(linear.bias))
    return lambda x: torch.ops.quantized.linear_dynamic_fp16.default(torch.from_numpy(x), packed).numpy()


def int8_product(linear):
    """The same product with fbgemm's int8 kernel: the weight (rounded by round_to_int8,
    so q = w / scale is exact) packed once as int8 with its per-row scales, the input
    quantized per call to 7 bits (reduce_range: AVX2's 16-bit pair sums cannot overflow)."""
    w = linear.weight.detach().contiguous()
    scale = int8_scales(w).double()
    with warnings.catch_warnings():  # PyTorch 2.13 deprecates quantized tensors:
        warnings.simplefilter("ignore", UserWarning)  # tests/test_cpu_decode.py fails where they go
        q = torch.quantize_per_channel(w, scale, torch.zeros_like(scale, dtype=torch.long), 0, torch.qint8)
    packed = torch.ops.quantized.linear_prepack(q, detached(linear.bias))
    return lambda x: torch.ops.quantized.linear_dynamic.default(torch.from_numpy(x), packed, True).numpy()


PRODUCTS = {"float32": numpy_product, "float16": float16_product, "int8": int8_product}


class Layer:
    """One block's arrays and matrix products."""

    def __init__(self, block, product):
        attn, mlp = block.attn, block.mlp
        self.ln_1, self.ln_2 = norm_arrays(block.ln_1), norm_arrays(block.ln_2)
        self.qkv, self.o = product(attn.c_attn), product(attn.c_proj)
        self.fc, self.out = product(mlp.c_fc), product(mlp.c_proj)
        self.q_norm = detached(attn.q_norm.weight) if attn.qk_norm else None
        self.k_norm = detached(attn.k_norm.weight) if attn.qk_norm else None
        self.rope = (as_array(attn.rope_cos), as_array(attn.rope_sin)) if attn.rope else None


def products(weights):
    """(the products of the steps after the checked ones, those of the checked ones):
    weights "float32", "float16" (after round_to_float16) or "int8" (after round_to_int8)."""
    fast = weights if has_fbgemm() else "float32"  # without fbgemm: float32 on the rounded weights
    checked = "float32" if fast == "int8" else fast  # int8 inputs are rounded: model.py's would differ
    return fast, checked


class CPUDecoder:
    """What generate_stream runs the model with on a CPU in float32: `new_cache()`
    gives model.py's KVCache, and `decoder(idx, cache)` the logits (B, vocab_size)
    after idx (B, T): one token with NumPy, a prompt (or a shifted window) through
    model.py, which fills the same cache. weights="float16": the products read float16
    copies of the matrices (after round_to_float16(model): the same values); "int8":
    int8 copies times 7-bit inputs (after round_to_int8(model)), the checked steps
    running float32 products on the same weights."""

    def __init__(self, model, weights="float32", note=None):
        self.model = model
        self.note = note or (lambda line: print(line, file=sys.stderr))
        self.checks_left = CHECKED_STEPS
        self.differs = None  # why model.py runs instead, once a check failed
        c = model.config
        self.config = c
        self.products, checked = products(weights)
        # (layers, head) of the checked steps, then of the later ones (the same where equal)
        self.checked = self.matrices(model, PRODUCTS[checked])
        self.fast = self.checked if checked == self.products else self.matrices(model, PRODUCTS[self.products])
        # after the head: a tied embedding is the head's weight, now laid out transposed
        self.wte = as_array(model.transformer.wte.weight)  # (padded vocab, C)
        self.ln_f = norm_arrays(model.transformer.ln_f) if c.norm_placement == "pre" else None
        self.positions = None
        if c.pos_encoding == "learned":
            self.positions = as_array(model.transformer.wpe.weight)
        elif c.pos_encoding == "sinusoidal":
            self.positions = as_array(model.sinusoid)
        self.activation = None if c.mlp == "swiglu" else ACTIVATIONS[c.mlp]

    @staticmethod
    def matrices(model, product):
        """Every block's Layer and the output layer's product, x (B, C) -> (B, padded vocab)."""
        return [Layer(block, product) for block in model.transformer.h], product(model.lm_head)

    def new_cache(self):
        return KVCache(self.config.n_layer, self.config.block_size)

    def __call__(self, idx, cache):
        full = cache.length >= cache.max_length
        if idx.size(1) > 1 or cache.k[0] is None or full or self.differs:
            return self.model.next_token_logits(idx, cache)  # model.py fills the cache
        if self.checks_left:
            return self.checked_step(idx, cache)
        return torch.from_numpy(self.step(idx[:, 0].numpy(), cache, self.fast))

    def checked_step(self, idx, cache):
        """One token both ways, model.py's forward first; this step's logits if they agree."""
        self.checks_left -= 1
        pos = cache.length
        expected = self.model.next_token_logits(idx, cache)  # writes this token's keys and values
        cache.length = pos
        logits = torch.from_numpy(self.step(idx[:, 0].numpy(), cache, self.checked))  # ...and this step
        gap = (logits - expected).abs().max().item()
        if gap <= TOLERANCE * max(1.0, expected.abs().max().item()):  # NaN fails too
            return logits
        self.differs = f"its logits differ from model.py's by {gap:.3g} at position {pos}"
        self.note(f"decode: gptkit/cpu_decode.py does not match model.py ({self.differs}; model.py "
                  "edited?): model.py runs every token")
        cache.length = pos
        return self.model.next_token_logits(idx, cache)  # model.py's keys and values again

    def attend(self, layer, x, cache, pos, index):
        """Self-attention of one new token per row; its keys and values go into the cache."""
        c = self.config
        B, H, Hkv, D = x.shape[0], c.n_head, c.kv_heads, c.head_dim
        qkv = layer.qkv(x)  # (B, (H + 2 Hkv) D)
        q = qkv[:, : H * D].reshape(B, H, D)
        k = qkv[:, H * D : (H + Hkv) * D].reshape(B, Hkv, D)
        v = qkv[:, (H + Hkv) * D :].reshape(B, Hkv, D)
        if layer.q_norm is not None:
            q, k = normalize(q, "rms", layer.q_norm, None), normalize(k, "rms", layer.k_norm, None)
        if layer.rope is not None:
            cos, sin = layer.rope[0][pos], layer.rope[1][pos]
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        keys, values = cache.k[index].numpy(), cache.v[index].numpy()  # (B, Hkv, max_length, D)
        keys[:, :, pos] = k
        values[:, :, pos] = v
        keys, values = keys[:, :, : pos + 1], values[:, :, : pos + 1]
        q = q.reshape(B, Hkv, H // Hkv, D)  # query head h uses key/value head h // (H / Hkv)
        scores = (q * (1.0 / math.sqrt(D))) @ keys.transpose(0, 1, 3, 2)  # (B, Hkv, H/Hkv, pos + 1)
        scores -= scores.max(axis=-1, keepdims=True)  # softmax, in place
        weights = np.exp(scores, out=scores)
        weights /= weights.sum(axis=-1, keepdims=True)
        y = (weights @ values).reshape(B, H * D)
        return layer.o(y)

    def feed_forward(self, layer, x):
        h = layer.fc(x)
        if self.activation is None:  # SwiGLU: silu(gate) * up
            gate, up = np.split(h, 2, axis=-1)
            h = gate / (1.0 + np.exp(-gate)) * up
        else:
            h = self.activation(h)
        return layer.out(h)

    def step(self, tokens, cache, matrices):
        """Logits (B, vocab_size) after one new token per row, tokens (B,), with
        `matrices` (layers, head) from self.matrices."""
        c, pos = self.config, cache.length
        layers, head = matrices
        x = self.wte[tokens]  # (B, C)
        if self.positions is not None:
            x = x + self.positions[pos]
        for index, layer in enumerate(layers):
            if c.norm_placement == "pre":
                x = x + self.attend(layer, normalize(x, *layer.ln_1), cache, pos, index)
                x = x + self.feed_forward(layer, normalize(x, *layer.ln_2))
            else:
                x = normalize(x + self.attend(layer, x, cache, pos, index), *layer.ln_1)
                x = normalize(x + self.feed_forward(layer, x), *layer.ln_2)
        cache.length += 1
        if self.ln_f is not None:
            x = normalize(x, *self.ln_f)
        logits = head(x)[:, : c.vocab_size]
        if c.logit_softcap is not None:
            logits = c.logit_softcap * np.tanh(logits / c.logit_softcap)
        return np.ascontiguousarray(logits, dtype=np.float32)
