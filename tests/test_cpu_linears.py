"""gptkit/fast/cpu_linears.py: the faster products swapped into model.py's built model on a CPU.
Each part against the nn.Linear it replaces and the whole model against model.py's float32
logits for every architecture variant (float32: equal to rounding; float16 and int8: the top
token and a logit tolerance), the same Parameters kept, a part that computes something else
or a weight its format cannot hold left as nn.Linear with one line, the operations the
parts need present, nothing of PyTorch's deprecated quantized stack, and sample.py's text."""

import contextlib
import copy
import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

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


def test_int8_without_the_kernel_gives_every_width_int8_by_padding_to_16(monkeypatch):
    """torch._weight_int8pack_mm reads the inputs in blocks of 16: a width that is not a
    multiple (an MLP of 88, 1 to 33 inputs) gets zero columns. Against the formula written
    out (x rounded to bfloat16, q and the scales as int8_rows gives them) and against a
    multiple of 16 whose extra inputs are zero, where the padding must change nothing."""
    monkeypatch.setattr(cpu_linears, "int8_product", lambda: (None, "torch._weight_int8pack_mm"))
    model = perturbed_model(GPTConfig(**{**BASE, "mlp_hidden": 88}), 0).eval()
    said = []
    assert len(cpu_linears.swap_linears(model, "int8", said.append)) == 9 and said == []
    assert model.transformer.h[0].mlp.c_proj.q.shape == (48, 96)
    for width in (1, 7, 15, 17, 33, 88):
        generator = torch.Generator().manual_seed(width)
        linear = nn.Linear(width, 24)
        x = torch.randn(2, 3, width, generator=generator)
        q, scale = cpu_linears.int8_rows(linear.weight.detach())
        formula = (x.bfloat16().float() @ q.float().T) * scale.bfloat16().float() + linear.bias.detach()
        wide = nn.Linear(width + 16 - width % 16 if width % 16 else width, 24)
        with torch.no_grad():
            wide.weight.zero_()[:, :width] = linear.weight
            wide.bias.copy_(linear.bias)
            got = cpu_linears.Int8Linear(linear)(x)
            padded_by_hand = cpu_linears.Int8Linear(wide)(torch.nn.functional.pad(x, (0, wide.in_features - width)))
        assert torch.equal(got, padded_by_hand)
        assert ((got - formula).norm() / formula.norm()).item() < 1e-2  # bfloat16 sums and scales


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
        assert re.search(r"; int8 products: torch._weight_int8pack_mm \(gptkit/fast/int8_kernel.c not used: "
                         r"`false` "
                         r"failed to build it \(no message\) \(remembered: remove \S+\.failed to try again\)\)$", header)
        assert model.transformer.h[0].mlp.c_fc.kernel is None and not list(tmp_path.rglob("*.so*"))
        torch.set_num_threads(2)
        assert cpu_linears.int8_product()[0] is None
    finally:
        torch.set_num_threads(1)
        int8_kernel.load.cache_clear()


# --- The int8 library in the cache: checked before it is loaded -------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A cache folder holding a library this process built: copied into each test's own cache."""
    folder = tmp_path_factory.mktemp("built")
    with fresh_cache(folder):
        int8_kernel.load()
    assert len(list((folder / "int8_kernel").glob("int8_kernel-*.so"))) == 1
    return folder / "int8_kernel"


@contextlib.contextmanager
def fresh_cache(folder):
    """load() with GPTKIT_CACHE_DIR=folder, as a new process sees it (load() caches its answer)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GPTKIT_CACHE_DIR", str(folder))
        int8_kernel.load.cache_clear()
        try:
            yield
        finally:
            int8_kernel.load.cache_clear()


def cache_copy(built, tmp_path):
    """(cache folder, its library, its record): a copy of `built` for one test to damage."""
    shutil.copytree(built, tmp_path / "int8_kernel", symlinks=True)
    library = next((tmp_path / "int8_kernel").glob("int8_kernel-*.so"))
    return tmp_path / "int8_kernel", library, library.with_suffix(".sha256")


def kernel_works_or_says_no_avx2(kernel, why_not):
    """The kernel loaded computes int8_linear's formula (or this CPU has no AVX2: said so)."""
    if kernel is None:
        assert why_not.startswith("this CPU has no AVX2")
        return
    linear = nn.Linear(70, 5)
    x = torch.randn(2, 70, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = cpu_linears.Int8Linear(linear, kernel=kernel)(x)
        assert ((got - linear(x)).norm() / linear(x).norm()).item() < 3e-2


def foreign_library(path):
    """A shared library that is not int8_kernel.c's: it has neither function."""
    source = path.with_suffix(".c")
    source.write_text("int other_function(void) { return 1; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", str(source), "-o", str(path)], check=True)


def truncated(library, record):
    library.write_bytes(library.read_bytes()[: library.stat().st_size // 2])  # SIGBUS once, if loaded


def one_byte_changed(library, record):
    data = bytearray(library.read_bytes())
    data[len(data) // 2] ^= 0xFF
    library.write_bytes(bytes(data))


def foreign_record_kept(library, record):
    foreign_library(library)  # the record is the real build's


def foreign_no_record(library, record):
    foreign_library(library)
    record.unlink()


def as_symlink(library, record):
    real = library.with_name("elsewhere.so")
    library.rename(real)
    library.symlink_to(real)


def another_users(library, record):
    os.chown(library, 65534, 65534)


DAMAGE = {
    "truncated": (truncated, "does not match the sha256 recorded when it was built"),
    "empty": (lambda library, record: library.write_bytes(b""), "does not match the sha256 recorded"),
    "one byte changed": (one_byte_changed, "does not match the sha256 recorded"),
    "a foreign library under its name": (foreign_record_kept, "does not match the sha256 recorded"),
    "planted, with no record": (foreign_no_record, r"has no record of its sha256 \(a library not built here\)"),
    "its record gone": (lambda library, record: record.unlink(), "has no record of its sha256"),
    "its record wrong": (lambda library, record: record.write_text("0" * 64), "does not match the sha256"),
    "chmod 666": (lambda library, record: library.chmod(0o666), r"can be written by others \(mode 0666\)"),
    "chmod g+w": (lambda library, record: library.chmod(0o775), r"can be written by others \(mode 0775\)"),
    "its record chmod 666": (lambda library, record: record.chmod(0o666), "has a record that can be written by"),
    "a symlink": (as_symlink, "is not a regular file"),
    "another user's": (another_users, r"belongs to user 65534, not to this user \(0\)"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_cached_library_that_fails_its_check_is_rebuilt_with_one_line(built, tmp_path, capfd, damage):
    """Loading a library runs its code: one that is not what this process's build recorded
    (however it differs) is never loaded, it is built again, and one line on stderr says so."""
    spoil, why = DAMAGE[damage]
    if damage == "another user's" and os.geteuid() != 0:
        pytest.skip("only root can give a file to another user")
    folder, library, record = cache_copy(built, tmp_path)
    spoil(library, record)
    capfd.readouterr()
    with fresh_cache(tmp_path):
        kernel, why_not = int8_kernel.load()
    said = capfd.readouterr().err.splitlines()
    assert len(said) == 1 and re.fullmatch(rf"decode: gptkit/fast/int8_kernel.c's cached {library} {why}.*: rebuilt",
                                           said[0]), said
    kernel_works_or_says_no_avx2(kernel, why_not)
    assert int8_kernel.unverified(library) is None and not library.is_symlink()
    assert sorted(p.name for p in folder.iterdir() if p.suffix not in (".c",) and p.name != "elsewhere.so") == sorted(
        [".int8_kernel.lock", library.name, record.name])


def test_a_killed_build_s_temporary_files_are_removed_by_the_next(built, tmp_path):
    folder, library, _ = cache_copy(built, tmp_path)
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid no process has now: a build killed with kill -9
    left = [folder / f".{library.name}.tmp-{dead.pid}", folder / f".{library.stem}.sha256.tmp-{dead.pid}"]
    for path in left:
        path.write_bytes(b"half a library")
    with fresh_cache(tmp_path):
        kernel_works_or_says_no_avx2(*int8_kernel.load())
    assert not any(path.exists() for path in left)


def test_a_verified_library_without_the_kernel_s_functions_is_refused_in_one_line(built, tmp_path, capfd):
    """A foreign library with a record that matches it (written by this user, by hand): loaded,
    it lacks kernel_isa and int8_linear: one line, torch's product, no AttributeError."""
    folder, library, record = cache_copy(built, tmp_path)
    foreign_library(library)
    record.write_text(int8_kernel.sha256(library) + "\n")
    with fresh_cache(tmp_path):
        assert int8_kernel.load() == (None, f"{library} is not gptkit/fast/int8_kernel.c's build "
                                            f"({library}: undefined symbol: kernel_isa)")
    assert capfd.readouterr().err == ""


def make_file(tmp_path):
    (tmp_path / "a file").write_text("")
    return tmp_path / "a file"


def world_writable(tmp_path):
    (tmp_path / "int8_kernel").mkdir(mode=0o777)
    (tmp_path / "int8_kernel").chmod(0o777)
    return tmp_path


def other_users_target(tmp_path):
    (tmp_path / "theirs").mkdir(mode=0o755)
    os.chown(tmp_path / "theirs", 65534, 65534)
    (tmp_path / "int8_kernel").symlink_to(tmp_path / "theirs")
    return tmp_path


FOLDERS = {
    "GPTKIT_CACHE_DIR is a file": (make_file, r"its cache folder cannot be made: .*/a file is not a folder "
                                              r"\(set GPTKIT_CACHE_DIR to a folder of yours\)"),
    "under a file": (lambda tmp_path: make_file(tmp_path) / "below",
                     "its cache folder cannot be made: .*/a file is not a .*"),
    "writable by all": (world_writable, r"its cache folder .*/int8_kernel can be written by others \(mode 0777\): "
                                        r"use a folder only you can write \(GPTKIT_CACHE_DIR\)"),
    "a symlink to another user's": (other_users_target, "its cache folder .*/theirs belongs to user 65534, .*"),
}


@pytest.mark.parametrize("case", sorted(FOLDERS))
def test_a_cache_folder_that_cannot_hold_code_we_run_keeps_torch_s_product_in_one_line(tmp_path, capfd, case):
    make, why = FOLDERS[case]
    if "another user" in case and os.geteuid() != 0:
        pytest.skip("only root can give a folder to another user")
    with fresh_cache(make(tmp_path)):
        kernel, why_not = int8_kernel.load()
    assert kernel is None and re.fullmatch(why, why_not), why_not
    assert capfd.readouterr().err == "" and not list(tmp_path.rglob("*.so"))


def test_a_cache_folder_through_a_symlink_of_ours_is_used(built, tmp_path):
    shutil.copytree(built, tmp_path / "real")
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "int8_kernel").symlink_to(tmp_path / "real")
    with fresh_cache(tmp_path / "cache"):
        kernel_works_or_says_no_avx2(*int8_kernel.load())


COMPILERS = {  # $CC that fails, and what load says
    "fails": ("false", "`false` failed to build it (no message)"),
    "writes nothing": ("true", "`true` failed to build it (it wrote nothing)"),
    "says bytes that are not UTF-8": ("sh -c 'printf \"\\377 broken\\n\" >&2; exit 1' --",
                                      "failed to build it (\N{REPLACEMENT CHARACTER} broken)"),
    "hangs": ("sh -c 'sleep 30' --", "did not finish building it in 1 s"),
}


@pytest.mark.parametrize("case", sorted(COMPILERS))
def test_a_failed_or_hung_build_is_remembered_and_says_how_to_try_again(tmp_path, monkeypatch, case):
    """The next process does not wait for the compiler again: it reads why from the marker
    (keyed by source, compiler and CPU), in one line naming the file to remove; removed,
    the build is tried again."""
    compiler, why = COMPILERS[case]
    monkeypatch.setattr(int8_kernel, "BUILD_SECONDS", 1)
    monkeypatch.setenv("CC", compiler)
    with fresh_cache(tmp_path):
        start = time.monotonic()
        kernel, first = int8_kernel.load()
        assert kernel is None and why in first and time.monotonic() - start < 10
    marker = next((tmp_path / "int8_kernel").glob("int8_kernel-*.failed"))
    assert first.endswith(f" (remembered: remove {marker} to try again)")
    assert sorted(p.name for p in marker.parent.iterdir()) == [".int8_kernel.lock", marker.name]  # no .so, no temp
    with fresh_cache(tmp_path):
        start = time.monotonic()
        assert int8_kernel.load() == (None, f"its build failed in an earlier run ({first.split(' (remembered')[0]}): "
                                            f"remove {marker} to try again")
        assert time.monotonic() - start < 0.5
    marker.unlink()  # as the line says: tried again
    with fresh_cache(tmp_path):
        assert int8_kernel.load()[1] == first
    monkeypatch.setenv("CC", "cc")  # another compiler: another key, tried afresh
    monkeypatch.setattr(int8_kernel, "BUILD_SECONDS", 120)
    with fresh_cache(tmp_path):
        kernel_works_or_says_no_avx2(*int8_kernel.load())


def test_two_processes_building_at_once_compile_once_and_both_load_it(tmp_path):
    """The second waits on the folder's lock for the first's build, then finds it verified."""
    log = tmp_path / "compiles"
    compiler = f"sh -c 'echo x >> {log}; sleep 1; exec cc \"$@\"' --"
    code = "from gptkit.fast import int8_kernel; k, why = int8_kernel.load(); print(why or 'loaded')"
    env = dict(os.environ, GPTKIT_CACHE_DIR=str(tmp_path), CC=compiler)
    runs = [subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [run.communicate(timeout=120) for run in runs]
    assert all(run.returncode == 0 for run in runs) and [err for _, err in outputs] == ["", ""]
    assert all(out.strip() == "loaded" or out.startswith("this CPU has no AVX2") for out, _ in outputs)
    assert log.read_text() == "x\n"


def test_sample_py_with_a_spoiled_cache_samples_int8_and_says_why_in_one_line(sharp, built, tmp_path):
    """The whole command, as a user meets it: a truncated library (which killed every int8
    process with SIGBUS) is rebuilt; GPTKIT_CACHE_DIR naming a file keeps torch's product."""
    _, library, record = cache_copy(built, tmp_path / "cache")
    truncated(library, record)
    cases = {tmp_path / "cache": f"decode: gptkit/fast/int8_kernel.c's cached {library} does not match the sha256 "
                                 "recorded when it was built (truncated or replaced): rebuilt",
             make_file(tmp_path): "(gptkit/fast/int8_kernel.c not used: its cache folder cannot be made: "}
    texts = []
    for cache, said in cases.items():
        command = [sys.executable, "sample.py", "--ckpt", str(sharp), "--device", "cpu", "--num_samples", "2",
                   "--max_new_tokens", "60", "--start", "ROMEO:", "--seed", "5", "--temperature", "0",
                   "--dtype", "int8"]
        env = dict(os.environ, GPTKIT_CACHE_DIR=str(cache), OMP_NUM_THREADS="1")
        out = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 0 and len(out.stdout) > 100, out.stderr
        texts.append(out.stdout)
        assert said in out.stderr and "Traceback" not in out.stderr
        assert "9 nn.Linear replaced by Int8Linear" in out.stderr
    assert int8_kernel.unverified(library) is None and texts[0] == texts[1]  # a sharp model: the same text


def test_a_cache_folder_that_cannot_be_written_keeps_torch_s_product_or_loads_what_it_holds(built, tmp_path):
    """chmod 500: nothing can be built there (one line, torch's product, no marker: a later
    chmod u+w tries again), and a verified library already there is still loaded."""
    empty = tmp_path / "empty" / "int8_kernel"
    empty.mkdir(parents=True)
    full = cache_copy(built, tmp_path / "full")[0]
    for folder in (empty, full):
        folder.chmod(0o500)
    # root writes anywhere: run as root without its capabilities (uid 0 still owns the folders)
    prefix = ["setpriv", "--inh-caps=-all", "--bounding-set=-all"] if os.geteuid() == 0 else []
    if prefix and not shutil.which("setpriv"):
        pytest.skip("setpriv is needed to take root's right to write anywhere")
    code = "from gptkit.fast import int8_kernel; kernel, why = int8_kernel.load(); print(why or 'loaded')"
    said = {}
    for folder in (empty, full):
        env = dict(os.environ, GPTKIT_CACHE_DIR=str(folder.parent))
        out = subprocess.run([*prefix, sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0 and out.stderr == "", out.stderr
        said[folder.parent.name] = out.stdout.strip()
    assert re.fullmatch(rf"`cc` could not build it in {empty} \(PermissionError: Permission denied\)", said["empty"])
    assert (said["full"] == "loaded" or said["full"].startswith("this CPU has no AVX2")) and not list(empty.iterdir())


def test_a_build_lock_that_is_never_let_go_is_waited_out_not_forever(built, tmp_path, monkeypatch):
    """Another process stuck holding the folder's lock (stopped with ^Z mid-build): a bounded
    wait, one line, torch's product."""
    import fcntl

    folder = cache_copy(built, tmp_path)[0]
    monkeypatch.setattr(int8_kernel, "BUILD_SECONDS", 0)
    monkeypatch.setattr(int8_kernel, "LOCK_MARGIN_SECONDS", 0.3)
    with open(folder / int8_kernel.LOCK_NAME, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another open file description: flock conflicts, as across processes
        with fresh_cache(tmp_path):
            assert int8_kernel.load() == (None, f"another process has held {folder / int8_kernel.LOCK_NAME} for over "
                                                "0.3 s (a build that does not end): not waiting longer")


def test_a_cached_library_that_cannot_be_replaced_is_skipped_with_one_line(built, tmp_path, capfd):
    """A folder under the library's name: not loaded, not removable by a rename: skipped."""
    folder, library, record = cache_copy(built, tmp_path)
    library.unlink()
    library.mkdir()
    with fresh_cache(tmp_path):
        kernel, why_not = int8_kernel.load()
    assert kernel is None and re.fullmatch(rf"the cached {library} is not a regular file, and `cc` could not build "
                                           rf"it in {folder} \(IsADirectoryError: Is a directory\)", why_not), why_not
    assert capfd.readouterr().err == "" and sorted(p.name for p in folder.iterdir()) == sorted(
        [".int8_kernel.lock", library.name, record.name])


@pytest.mark.parametrize("compiler, why", [("/nonexistent/cc", "No such file or directory"),
                                           (__file__, "Permission denied"), ('"', None)])
def test_no_compiler_is_one_line_and_not_remembered(tmp_path, monkeypatch, compiler, why):
    """A compiler that is not there (or not a program) is quick to find again: nothing written."""
    monkeypatch.setenv("CC", compiler)
    with fresh_cache(tmp_path):
        said = int8_kernel.load()[1]
    if why is None:
        assert said == "$CC cannot be split into words (No closing quotation)"
    else:
        assert said == f"no compiler `{compiler}` ({why}): install one, or name it in $CC"
        assert sorted(p.name for p in (tmp_path / "int8_kernel").iterdir()) == [".int8_kernel.lock"]


def test_a_hung_build_ends_with_all_the_compiler_started(tmp_path, monkeypatch):
    """Past BUILD_SECONDS the compiler's whole process group is killed (cc1, as, ld), not only
    the driver: nothing of it is left running, nor holding its output open to be waited for."""
    group = tmp_path / "group"
    monkeypatch.setattr(int8_kernel, "BUILD_SECONDS", 1)
    monkeypatch.setenv("CC", f"sh -c 'echo $$ > {group}; sleep 30 & sleep 30' --")
    start = time.monotonic()
    with fresh_cache(tmp_path / "cache"):
        assert "did not finish building it in 1 s" in int8_kernel.load()[1]
    assert time.monotonic() - start < 15  # not the 30 s its children would hold the pipes open
    pgid = int(group.read_text())

    def alive():
        found = []
        for stat_file in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError):
                fields = stat_file.read_text().rsplit(")", 1)[1].split()  # after "pid (name)": state, ppid, pgrp
                if int(fields[2]) == pgid and fields[0] != "Z":
                    found.append(stat_file.parent.name)
        return found

    deadline = time.monotonic() + 5  # SIGKILL is sent; a killed process may take a moment to be gone
    while alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive() == []  # never the 30 s of `sleep 30` the children would live unkilled
