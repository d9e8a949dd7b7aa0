"""gptkit/fast/cpu_linears.py: the faster products swapped into model.py's built model on a CPU.
Each part against the nn.Linear it replaces and the whole model against model.py's float32
logits for every architecture variant (float32: equal to rounding; float16 and int8: the top
token and a logit tolerance), the same Parameters kept, a part that computes something else
or a weight its format cannot hold left as nn.Linear with one line, the operations the
parts need present, nothing of PyTorch's deprecated quantized stack, and sample.py's text."""

import copy
import re
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn as nn

from gptkit.fast import cpu_linears

from gptkit.fast import int8_kernel
from gptkit.generation.generate import cached_logits, generate_stream, prepare_for_generating
from model import GPT, GPTConfig
from repo import REPO
from test_sample import CHARS, save_tiny
from train_helpers import perturbed_model

BASE = dict(block_size=24, vocab_size=37, n_layer=2, n_head=4, n_embd=48)  # SwiGLU hidden 128
MODERN = dict(pos_encoding="rope", norm="rmsnorm", mlp="relu2", bias=False, qk_norm=True, tie_embeddings=False,
              logit_softcap=15.0)
VARIANTS = {
    "gpt2": {},
    "nanogpt": dict(mlp="gelu_exact", bias=False),
    "quick start": MODERN,
    "sinusoidal, post-norm": dict(pos_encoding="sinusoidal", norm_placement="post"),
    "no positions, rmsnorm with bias": dict(pos_encoding="none", norm="rmsnorm"),
    "llama: swiglu, grouped-query": dict(MODERN, mlp="swiglu", qk_norm=False, logit_softcap=None, n_kv_head=2),
    "multi-query, padded vocab, tied": dict(MODERN, n_kv_head=1, pad_vocab_multiple=16, tie_embeddings=True),
}
CPU = torch.device("cpu")


def model_for(variant, seed=0):
    return perturbed_model(GPTConfig(**{**BASE, **VARIANTS[variant]}), seed).eval()


def swapped(model, weights):
    said = []
    parts = cpu_linears.swap_linears(model, weights, said.append)
    assert said == [] and len(parts) == 4 * model.config.n_layer + 1
    return model


@torch.inference_mode()
def logits_along(model, tokens):
    """Logits (B, T - 3, vocab) after a 4-token prompt and then each token through the KV cache."""
    from model import KVCache

    cache = KVCache(model.config.n_layer, model.config.block_size)
    got = [model.next_token_logits(tokens[:, :4], cache)]
    got += [model.next_token_logits(tokens[:, t : t + 1], cache) for t in range(4, tokens.size(1))]
    return torch.stack(got, 1)


# float16 and int8 against float32 on the unrounded weights, measured on these models: float16
# moves a logit by < 0.3% of the largest, int8 (with bfloat16 inputs) by 1-3%; the top token stays.
LIMITS = {"float32": (2e-5, 1.0), "float16": (1e-2, 0.95), "int8": (5e-2, 0.9)}


@pytest.mark.parametrize("weights", sorted(LIMITS))
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_swapped_model_keeps_model_pys_logits_for_every_variant(variant, weights):
    full = model_for(variant)
    model = swapped(copy.deepcopy(full), weights)
    tokens = torch.randint(0, BASE["vocab_size"], (3, 20), generator=torch.Generator().manual_seed(1))
    got, want = logits_along(model, tokens), logits_along(full, tokens)
    gap = ((got - want).abs().max() / want.abs().max()).item()
    tolerance, agreement = LIMITS[weights]
    assert gap <= tolerance, gap
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= agreement
    if weights != "float32":
        assert gap > 0  # the rounded format really runs


def test_each_part_keeps_the_module_s_parameters_and_the_state_dict():
    model = model_for("multi-query, padded vocab, tied")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    parameters = dict(model.named_parameters())
    for weights in ("int8", "float32"):  # a second swap finds no nn.Linear left
        cpu_linears.swap_linears(model, weights, print)
    assert isinstance(model.transformer.h[0].mlp.c_fc, cpu_linears.Int8Linear)
    assert model.lm_head.weight is model.transformer.wte.weight  # still tied
    assert dict(model.named_parameters()).keys() == parameters.keys()
    for name, p in model.named_parameters():
        assert p is parameters[name] and torch.equal(p, before[name])  # the same Parameters, unchanged
    assert model.state_dict().keys() == before.keys()  # a checkpoint written now loads anywhere


def test_a_part_follows_model_py_where_a_gradient_is_wanted():
    linear = nn.Linear(8, 5)
    x = torch.randn(2, 8, requires_grad=True)
    for part in (cpu_linears.NumPyLinear(copy.deepcopy(linear)), cpu_linears.Int8Linear(copy.deepcopy(linear))):
        y = part(x)
        y.sum().backward()
        assert part.weight.grad is not None and torch.allclose(y, linear(x), atol=1e-6)


def test_a_part_that_computes_something_else_stays_nn_linear_and_says_so(monkeypatch):
    model = model_for("gpt2")
    monkeypatch.setattr(cpu_linears.NumPyLinear, "forward", lambda self, x: 2 * nn.functional.linear(x, self.weight, self.bias))
    said = []
    assert cpu_linears.swap_linears(model, "float32", said.append) == []
    assert len(said) == 1 and said[0].startswith("decode: 9 nn.Linear stay model.py's (NumPyLinear, lm_head, "
                                                 "transformer.h.0.attn.c_attn, ")
    assert said[0].endswith(": its output differs by 1 of the product's size (allowed 1e-05))")
    assert all(type(m) is nn.Linear for m in model.modules() if isinstance(m, (nn.Linear, cpu_linears.NumPyLinear)))


@pytest.mark.parametrize("value, weights, why", [
    (float("inf"), "int8", "it holds a non-finite value"),
    (float("nan"), "float32", "it holds a non-finite value"),
    (1e5, "float16", "it holds 100000, past float16's largest value 65504"),
])
def test_a_weight_the_format_cannot_hold_keeps_that_matrix_in_float32(value, weights, why):
    model = model_for("gpt2")
    with torch.no_grad():
        model.transformer.h[1].mlp.c_fc.weight[0, 0] = value
    said = []
    parts = cpu_linears.swap_linears(model, weights, said.append)
    assert said == [f"decode: 1 nn.Linear stay model.py's ({cpu_linears.PARTS[weights].__name__}, "
                    f"transformer.h.1.mlp.c_fc: {why})"]
    assert len(parts) == 8 and type(model.transformer.h[1].mlp.c_fc) is nn.Linear


def test_int8_keeps_a_matrix_whose_inputs_its_kernel_cannot_take_in_float32(monkeypatch):
    model = perturbed_model(GPTConfig(**{**BASE, "mlp_hidden": 88}), 0).eval()
    if int8_kernel.load()[0] is not None:  # int8_kernel.c takes any width (a masked tail)
        said = []
        cpu_linears.swap_linears(copy.deepcopy(model), "int8", said.append)
        assert said == []
    monkeypatch.setattr(cpu_linears, "int8_product", lambda: (None, "torch._weight_int8pack_mm"))
    said = []
    cpu_linears.swap_linears(model, "int8", said.append)
    assert said == ["decode: 2 nn.Linear stay model.py's (Int8Linear, transformer.h.0.mlp.c_proj, "
                    "transformer.h.1.mlp.c_proj: its 88 inputs are not a multiple of 16, which "
                    "torch._weight_int8pack_mm needs)"]
    assert isinstance(model.transformer.h[0].mlp.c_fc, cpu_linears.Int8Linear)


def test_int8_with_a_huge_weight_samples_where_float32_does():
    """A weight of 1e30 (a hostile checkpoint): float32 samples; int8 must too, never a crash."""
    model = model_for("gpt2")
    with torch.no_grad():
        model.transformer.h[0].mlp.c_proj.weight[3, 3] = 1e30
    for weights in ("float32", "int8"):
        net = copy.deepcopy(model)
        prepare_for_generating(net, weights, CPU, note=lambda line: None)
        tokens = list(generate_stream(net, torch.tensor([[1, 2]]), 6, temperature=0.8, generator=torch.Generator()))
        assert len(tokens) == 6


def test_the_operations_the_fast_parts_need_are_in_this_pytorch():
    # Loud on a PyTorch without them: the route would fall back to float32's products.
    for weights in cpu_linears.PARTS:
        assert cpu_linears.available(weights) is None, f"this PyTorch lacks {cpu_linears.available(weights)}"


def test_a_missing_operation_falls_back_to_float32_in_one_line(monkeypatch):
    monkeypatch.delattr(torch, "_weight_int8pack_mm")
    model, said = model_for("gpt2"), []
    header = prepare_for_generating(model, "int8", CPU, note=said.append)
    assert said == ["decode: this PyTorch has no torch._weight_int8pack_mm for --dtype int8: model.py's float32 "
                    "products run instead"]
    assert "9 nn.Linear replaced by NumPyLinear" in header


def test_a_model_py_that_reads_a_linear_as_the_parts_do_not_allow_gets_nn_linear_back():
    model, said = model_for("gpt2"), []
    mlp = model.transformer.h[0].mlp

    def edited(x, forward=mlp.forward):  # a learner's edit that insists on an nn.Linear
        if not isinstance(mlp.c_fc, nn.Linear):
            raise TypeError("c_fc is not an nn.Linear")
        return forward(x)

    mlp.forward = edited
    header = prepare_for_generating(model, "float32", CPU, note=said.append)
    assert said == ["decode: gptkit/fast/cpu_linears.py's parts put back to nn.Linear (c_fc is not an nn.Linear): "
                    "model.py runs as written"]
    assert header == "decode: model.py's forward with its KV cache (no nn.Linear swapped)"
    assert all(type(m) is nn.Linear for m in model.modules() if hasattr(m, "out_features"))


def test_int8_parts_keep_the_cache_where_their_rounding_moves_the_logits():
    """The checks of model.py's own forward (its cache, its batching) run on its nn.Linear
    modules, not on the parts: an int8 part rounds each row of inputs to int8, and on GPT-2
    124M's shape (seed 1337) the cached and the whole-context forward, float roundings apart,
    round one value a step apart, ~2% of the logits. Judged with the parts, that read as a
    broken cache: `sample.py --dtype int8` recomputed the context every token, ~10x slower."""
    from gptkit.generation import generate
    from gptkit.serve.server import batch_size_that_runs

    torch.manual_seed(1337)
    model, said = GPT(GPTConfig()).eval(), []
    prepare_for_generating(model, "int8", CPU, note=said.append)
    assert type(model.transformer.h[0].mlp.c_fc) is cpu_linears.Int8Linear and not said
    # (generate.cache_check(model), run on the parts, says "its logits differ by 0.017" here: their rounding)
    assert generate.cache_differs(model, note=said.append) is None and not said
    assert type(model.transformer.h[0].mlp.c_fc) is cpu_linears.Int8Linear  # the parts back after the check
    assert batch_size_that_runs(model, CPU, 16, "header") == ("header", 16)


def test_no_call_of_pytorchs_deprecated_quantized_stack_outside_the_tests():
    # (and nothing silences its warnings: test_generating_warns_of_nothing turns them into errors)
    pattern = re.compile(r"torch\.quantize_per_\w+|torch\.ops\.quantized|torch\.q(u)?int8|linear_prepack")
    for path in REPO.rglob("*.py"):
        parts = path.relative_to(REPO).parts
        if parts[0] in ("tests", ".git") or parts[0].startswith(("wt", ".")):
            continue
        assert not pattern.search(path.read_text()), path


def test_generating_warns_of_nothing(recwarn):
    for weights in ("float32", "float16", "int8"):
        model = model_for("quick start")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            prepare_for_generating(model, weights, CPU, note=print)
            list(generate_stream(model, torch.tensor([[1, 2]]), 4, temperature=0))


def sample(path, *args):
    command = [sys.executable, "sample.py", "--ckpt", str(path), "--device", "cpu", "--num_samples", "2",
               "--max_new_tokens", "60", "--start", "ROMEO:", "--seed", "5", *args]
    out = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout, out.stderr


@pytest.fixture(scope="module")
def sharp(tmp_path_factory):
    config = GPTConfig(block_size=16, vocab_size=len(CHARS), n_layer=2, n_head=2, n_embd=16)
    torch.manual_seed(0)
    model = GPT(config)
    with torch.no_grad():
        model.transformer.wte.weight.mul_(40.0)
    return save_tiny(tmp_path_factory.mktemp("sharp") / "m.pt", model.eval())


def test_sample_py_names_its_parts_and_prints_model_pys_text(sharp):
    default, said = sample(sharp, "--temperature", "0")
    assert default == sample(sharp, "--temperature", "0", "--cpu_decode", "false")[0] and len(default) > 100
    assert "decode: model.py's forward with its KV cache; 9 nn.Linear replaced by NumPyLinear (gptkit/fast/cpu_linears.py" in said
    for weights, part in (("float16", "Float16Linear"), ("int8", "Int8Linear")):
        text, said = sample(sharp, "--temperature", "0", "--dtype", weights)
        assert f"9 nn.Linear replaced by {part}" in said and "Warning" not in said
        assert text == default  # a sharp model: float32's text


def test_int8_without_the_parts_and_off_a_cpu_is_refused_in_one_line(sharp):
    command = [sys.executable, "sample.py", "--ckpt", str(sharp), "--device", "cpu", "--dtype", "int8",
               "--cpu_decode", "false"]
    out = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        "error: --dtype int8 is gptkit/fast/cpu_linears.py's Int8Linear: leave out --cpu_decode false and --compile"]


@pytest.mark.parametrize("block_size", [1, 2])
def test_a_context_too_short_for_the_check_still_gets_its_parts_and_samples(block_size):
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=16, block_size=block_size, vocab_size=5)).eval()
    header = prepare_for_generating(model, "auto", CPU, note=print)
    assert "5 nn.Linear replaced by NumPyLinear" in header
    assert len(list(generate_stream(model, torch.tensor([[1]]), 6, temperature=0, shift_context=True))) == 6


def kernel_or_skip():
    kernel, why_not = int8_kernel.load()
    if kernel is None:
        pytest.skip(f"gptkit/fast/int8_kernel.c is not used here: {why_not}")
    return kernel


# Each instruction set's path, built as a CPU of that class builds it (-march=native on one):
# every path the machine can run is tested here, so an AVX-512 machine tests the AVX2 path too.
ARCHES = {"native": None, "AVX2": "-march=x86-64-v3", "AVX-VNNI": "-march=x86-64-v3 -mavxvnni"}


@pytest.fixture(params=sorted(ARCHES))
def kernel_of_each_path(request, monkeypatch):
    if ARCHES[request.param]:
        monkeypatch.setenv("GPTKIT_INT8_ARCH", ARCHES[request.param])
    int8_kernel.load.cache_clear()
    try:
        kernel = kernel_or_skip()
        assert request.param in ("native", kernel.isa)  # the path asked for is the path built
        yield kernel
    finally:
        int8_kernel.load.cache_clear()


@pytest.mark.parametrize("rows, width, bias", [(1, 768, True), (3, 100, False), (2, 3072, True), (1, 64, False),
                                               (2, 31, True), (1, 1, False)])
def test_the_int8_kernel_computes_its_formula_written_out(rows, width, bias, kernel_of_each_path):
    """int8_kernel.c's int8_linear against the same arithmetic in torch: x and W rounded to
    int8 per row (scale max|row| / 127), exact int32 sums, times both scales, plus the bias.
    Widths not a multiple of 64 or 32 exercise each path's tail; several rows share each
    weight row. On every instruction set the machine runs (AVX-512 VNNI, AVX-VNNI, AVX2)."""
    kernel = kernel_of_each_path
    generator = torch.Generator().manual_seed(width)
    linear = nn.Linear(width, 40, bias=bias)
    x = torch.randn(rows, width, generator=generator) * 3
    x[0, 0] = 0.0
    part = cpu_linears.Int8Linear(linear, kernel=kernel)
    xs = x.abs().amax(dim=1, keepdim=True) / 127  # (rows, 1)
    xq = torch.round(x / xs).to(torch.int64)  # half to even, as lrintf
    q, ws = cpu_linears.int8_rows(linear.weight.detach())
    expected = (xq @ q.to(torch.int64).T).float() * xs * ws  # int64 sums: exact
    if bias:
        expected = expected + linear.bias.detach()
    with torch.no_grad():
        got = part(x)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    assert torch.equal(part(torch.zeros(2, width)), torch.zeros(2, 40) + (linear.bias.detach() if bias else 0))


def test_the_int8_products_are_named_in_the_header_and_fall_back_in_one_line(monkeypatch, tmp_path):
    kernel_or_skip()
    header = prepare_for_generating(model_for("gpt2"), "int8", CPU, note=print)
    kernel = int8_kernel.load()[0]
    assert header.endswith(f"; int8 products: gptkit/fast/int8_kernel.c on one thread ({kernel.isa})")
    monkeypatch.setenv("CC", "false")  # a compiler that fails: torch's product, said in the header
    monkeypatch.setenv("GPTKIT_CACHE_DIR", str(tmp_path))
    int8_kernel.load.cache_clear()
    try:
        model = model_for("gpt2")
        header = prepare_for_generating(model, "int8", CPU, note=print)
        assert header.endswith("; int8 products: torch._weight_int8pack_mm "
                               "(gptkit/fast/int8_kernel.c not used: `false` failed to build it (no message))")
        assert model.transformer.h[0].mlp.c_fc.kernel is None and not list(tmp_path.rglob("*.so*"))
        torch.set_num_threads(2)
        assert cpu_linears.int8_product()[0] is None
    finally:
        torch.set_num_threads(1)
        int8_kernel.load.cache_clear()
