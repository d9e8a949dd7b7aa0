"""ReLU² and RMSNorm with their backward pass written by hand, swapped into a built GPT.

On a CPU, at the small widths the quick start trains, autograd's own
backward for ReLU² and RMSNorm costs more than it should: `relu(h).square()`
keeps both the ReLU and the power in the graph (a threshold pass plus a pow
backward that computes 2·h¹ with a general power), and `F.rms_norm`'s CPU backward
is decomposed into a chain of small ops. The functions below save exactly what
their gradient needs and compute it in a few passes: measured at one thread,
ReLU² forward + backward on a (32, 64, 512) tensor takes 4.2 ms instead of 12,
RMSNorm on (32, 64, 128) 1.6 ms instead of 2.5 (BENCHMARKS.md).
Same values: the forwards are bitwise those of model.py, the ReLU² gradient is
bitwise autograd's, RMSNorm's agrees to rounding and passes
torch.autograd.gradcheck (tests/test_fused.py).

model.py keeps the plain formulas. `apply(model)` swaps these versions into a
built model from outside, as nanochat converts its Linear layers to FP8 after
building the model; train.py calls it for runs in float32 on the CPU (its setting
`cpu_kernels`, fused by default; `--cpu_kernels model` runs model.py's modules, and
the run's header and config.json say which ran):

    model = GPT(GPTConfig(norm="rmsnorm", mlp="relu2"))
    fused.apply(model)   # same parameters, same state_dict, faster backward on CPU float32

A guest of model.py, not a second copy of it: before swapping, `apply` runs each
kind of module both ways, model.py's and ours, forward and backward on small
random inputs (`differs`), in training and in evaluation mode and at scales from
1e-4 to 1e4 (the range training sees, and beyond), and leaves model.py's module in
place, with one line saying so, where they disagree beyond rounding: a learner who
edits RMSNorm or ReLU² in model.py (a clamp, a change in training mode only) trains
the edit. Measured cost: a few ms per kind, once per run.

The swapped modules still check every tensor they get and fall back to model.py's
formula for anything but float32 on the CPU (CUDA, where torch.compile fuses these
anyway, or bfloat16 under autocast), so a model that is moved or cast after
apply() computes exactly what an untouched one would.
"""

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

import model as model_py

# The model.py classes these stand in for, looked up by name: where a learner renamed or
# removed one, a placeholder no module is an instance of, and model.py's modules train
# as written (the run's header says which ran).
RMSNorm = getattr(model_py, "RMSNorm", None) or type("RMSNorm", (nn.Module,), {})
ReLU2 = getattr(model_py, "ReLU2", None) or type("ReLU2", (nn.Module,), {})
NORM_EPS = getattr(model_py, "NORM_EPS", 1e-6)  # a changed or missing eps: differs() compares the results


class ReLU2Function(torch.autograd.Function):
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
    return ReLU2Function.apply(h)


def rms_norm(x, weight, eps):
    return RMSNormFunction.apply(x, weight, eps)


def use_fused(x):
    """The hand-written versions pay off for float32 on the CPU (measured); not elsewhere."""
    return x.is_cpu and x.dtype == torch.float32


class FusedReLU2(ReLU2):
    def forward(self, h):
        return relu2(h) if use_fused(h) else super().forward(h)


class FusedRMSNorm(RMSNorm):
    def forward(self, x):
        if not use_fused(x):
            return super().forward(x)
        y = rms_norm(x, self.weight, NORM_EPS)
        return y if self.bias is None else y + self.bias


def swapped(module):
    """The fused stand-in for `module`, holding the very same parameters; None if it has none."""
    if type(module) is ReLU2:
        return FusedReLU2()
    if type(module) is RMSNorm:
        fast = FusedRMSNorm(module.weight.numel(), bias=module.bias is not None)
        fast.weight, fast.bias = module.weight, module.bias  # shared, not copied: optimizers and checkpoints see no change
        return fast.train(module.training)
    return None


def swapped_count(model):
    """How many of `model`'s modules are the fused versions (0: model.py's run)."""
    return sum(isinstance(m, (FusedReLU2, FusedRMSNorm)) for m in model.modules())


# The probes' scales: inputs of every size training meets and far beyond (a ReLU² input of
# 1e4, an activation of 1e-4), so that an edit which changes model.py's formula only for
# some inputs (a clamp at 3.5, a branch on small norms) shows in one of them.
PROBE_SCALES = (1e-4, 1e-2, 1.0, 10.0, 1e2, 1e4)


def near(a, b, rtol):
    """a and b agree to rtol of their largest magnitude (a probe's values share one scale)."""
    return a.shape == b.shape and bool((a - b).abs().max() <= rtol * a.abs().max().clamp_min(1e-30))


def differs(module):
    """Why the fused version of `module` (one of model.py's) cannot stand in for it, or
    None: both run forward and backward on the same random inputs and upstream gradients,
    on copies of its parameters (the model itself is untouched), in training mode and in
    evaluation mode (an edit may apply in one of them only), at each of PROBE_SCALES."""
    probe = copy.deepcopy(module).float()
    try:  # an RMSNorm edited past what FusedRMSNorm can hold (no weight, another constructor)
        fast = swapped(probe)  # shares the probe's parameters
        width = probe.weight.numel() if isinstance(probe, RMSNorm) else 16
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    g = torch.Generator().manual_seed(0)
    for training in (True, False):
        probe.train(training), fast.train(training)
        for scale in PROBE_SCALES:
            x = torch.randn(2, 5, width, generator=g) * scale
            upstream = torch.randn(2, 5, width, generator=g)
            why = compared(probe, fast, x, upstream)
            if why:
                return f"{why}, in {'training' if training else 'evaluation'} mode, inputs of scale {scale:g}"
    return None


def compared(probe, fast, x, upstream):
    """Why the two modules' forward or backward on input x differ, or None."""
    results = []
    for m in (probe, fast):
        xi = x.clone().requires_grad_()
        try:
            with torch.random.fork_rng(devices=[]):  # the run's random state is left as it was
                torch.manual_seed(0)  # an edit that draws random numbers draws the same ones in both
                y = m(xi)
            grads = torch.autograd.grad((y * upstream).sum(), [xi, *m.parameters()], allow_unused=True)
        except Exception as e:  # an edit that breaks one of them: model.py's then runs (and says why)
            return f"{type(e).__name__}: {e}"
        results.append((y.detach(), [t for t in grads if t is not None]))
    (y0, g0), (y1, g1) = results
    if y0.shape != y1.shape:
        return "shapes differ"
    if not near(y0, y1, 1e-5):
        return f"its forward differs from model.py's by {(y0 - y1).abs().max().item():.2g}"
    if len(g0) != len(g1) or any(not near(a, b, 1e-4) for a, b in zip(g0, g1)):
        return "its backward differs from autograd's through model.py's forward"
    return None


def apply(model, note=print):
    """Replace every RMSNorm and ReLU² module of `model` by its fused version, in place,
    each kind only if it computes what model.py's does (`differs`); `note(line)` hears
    of a kind left as model.py's, and why.

    Parameter names, order and tensors stay the same, so call it before building
    optimizers or wrapping the model (DDP, FSDP, torch.compile). Returns the model."""
    verdicts = {}  # (kind, width, bias) -> why not, or None
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) not in (RMSNorm, ReLU2):
                continue
            key = (type(child), getattr(child, "weight", torch.empty(0)).numel(),
                   getattr(child, "bias", None) is not None)
            if key not in verdicts:
                verdicts[key] = differs(child)
                if verdicts[key] and note is not None:
                    note(f"kernels: gptkit/fast/fused.py's {type(child).__name__} does not match model.py's "
                         f"({verdicts[key]}): model.py's {type(child).__name__} runs")
            if verdicts[key] is None:
                setattr(parent, name, swapped(child))
    return model


def describe(model):
    """What runs for RMSNorm and ReLU² in `model`, for the run's header."""
    present = {type(m) for m in model.modules()}
    kinds = [name for cls, name in ((FusedRMSNorm, "RMSNorm"), (FusedReLU2, "ReLU²")) if cls in present]
    if not kinds:
        return "model.py"
    return (f"gptkit/fast/fused.py ({', '.join(kinds)} backward by hand, checked against model.py; "
            "--cpu_kernels model for model.py's)")
