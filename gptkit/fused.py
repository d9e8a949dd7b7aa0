"""Two elementwise steps of the block with their backward pass written by hand.

On a CPU, at the small widths the quick start trains (128), autograd's own
backward for ReLU² and RMSNorm costs more than it should: `relu(h).square()`
keeps both the ReLU and the power in the graph (a threshold pass plus a pow
backward that computes 2·h¹ with a general power), and `F.rms_norm`'s CPU backward
is decomposed into a chain of small ops. The functions below save exactly what
their gradient needs and compute it in a few passes: measured at one thread,
ReLU² forward + backward on a (32, 64, 512) tensor takes 4.2 ms instead of 12,
RMSNorm on (32, 64, 128) 1.6 ms instead of 2.5 (BENCHMARKS.md, issue 13).
model.py uses them for float32 tensors on the CPU; elsewhere (CUDA, where
torch.compile fuses these anyway, or bfloat16) it keeps the library calls.
Same values: the ReLU² gradient is bitwise equal to autograd's, RMSNorm's
agrees to rounding and passes torch.autograd.gradcheck (tests/test_fused.py).

    python -c "import torch; from gptkit.fused import relu2; print(relu2(torch.tensor([-1.0, 2.0])))"
"""

import torch
import torch.nn.functional as F


class ReLU2(torch.autograd.Function):
    """relu(h)², whose derivative is 2·relu(h): zero wherever h < 0 by itself."""

    @staticmethod
    def forward(ctx, h):
        r = F.relu(h)
        ctx.save_for_backward(r)
        return r * r

    @staticmethod
    def backward(ctx, grad):
        (r,) = ctx.saved_tensors
        return 2 * r * grad


class RMSNormFunction(torch.autograd.Function):
    """y = x̂·w with x̂ = x·r, r = 1/sqrt(mean(x²) + eps) over the last dimension.

    Backward, for g = dL/dy and ĝ = g·w: dL/dw = Σ g·x̂ over every position, and
    dL/dx = r·(ĝ − x̂·mean(ĝ·x̂)): ĝ minus its component along x̂, which the
    normalisation cannot change, scaled back by r."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        r = torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)  # (..., 1)
        x_hat = x * r
        ctx.save_for_backward(x_hat, r, weight)
        return x_hat * weight

    @staticmethod
    def backward(ctx, grad):
        x_hat, r, weight = ctx.saved_tensors
        grad_weight = (grad * x_hat).reshape(-1, x_hat.size(-1)).sum(0)  # (C,)
        g_hat = grad * weight
        grad_x = r * (g_hat - x_hat * (g_hat * x_hat).mean(-1, keepdim=True))
        return grad_x, grad_weight, None


def relu2(h):
    return ReLU2.apply(h)


def rms_norm(x, weight, eps):
    return RMSNormFunction.apply(x, weight, eps)


def use_fused(x):
    """The hand-written versions pay off for float32 on the CPU (measured); not elsewhere."""
    return x.is_cpu and x.dtype == torch.float32
