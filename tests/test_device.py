"""gptkit/ops/device.py on CPU, with a GPU's compute capability patched in: dtype=auto
picks bfloat16 only where the GPU computes it natively (8.0 and later), float16
with a GradScaler on older GPUs (V100, T4); Muon's Newton-Schulz follows; TF32 is
set through one API."""

import os
import platform
import subprocess
import sys

import pytest
import torch

import train
from gptkit.ops import device as gdevice
from gptkit.train import distributed, muon, setup
from repo import REPO
from train_helpers import tiny_args


@pytest.fixture
def gpu_with_capability(monkeypatch):
    """A pretend CUDA GPU of the given compute capability (no ROCm)."""

    def pretend(major, minor):
        monkeypatch.setattr(torch.version, "hip", None)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, minor))
        # Emulated bfloat16 counts as "supported" there: dtype=auto must not ask it.
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)

    return pretend


@pytest.mark.parametrize("capability, training, inference, matmul", [
    ((7, 0), torch.float16, torch.float32, torch.float16),  # V100
    ((7, 5), torch.float16, torch.float32, torch.float16),  # T4 (Colab)
    ((8, 0), torch.bfloat16, torch.bfloat16, torch.bfloat16),  # A100
    ((9, 0), torch.bfloat16, torch.bfloat16, torch.bfloat16),  # H100
])
def test_auto_dtype_follows_native_bfloat16(gpu_with_capability, capability, training, inference, matmul):
    gpu_with_capability(*capability)
    assert gdevice.training_dtype("auto", "cuda:0") == training
    assert gdevice.inference_dtype("auto", torch.device("cuda")) == inference
    assert gdevice.matmul_dtype("cuda") == matmul
    assert gdevice.training_dtype("bfloat16", "cuda") == torch.bfloat16  # an explicit choice stands


def test_cpu_stays_float32():
    assert gdevice.training_dtype("auto", "cpu") == torch.float32
    assert gdevice.inference_dtype("auto", torch.device("cpu")) == torch.float32
    assert gdevice.matmul_dtype("cpu") == torch.float32


def test_device_choose_on_a_t4_trains_in_float16_with_a_scaler_and_tf32(gpu_with_capability, monkeypatch, tmp_path):
    gpu_with_capability(7, 5)
    monkeypatch.setattr(torch.backends.cuda.matmul, "fp32_precision", torch.backends.cuda.matmul.fp32_precision)
    monkeypatch.setattr(torch.backends.cudnn.conv, "fp32_precision", torch.backends.cudnn.conv.fp32_precision)
    from gptkit.config import parse_settings

    _, cfg = parse_settings(tiny_args(tmp_path, tmp_path / "out", device="auto", dtype="auto", compile="auto"),
                            [train.GPTConfig, train.TrainConfig])
    dev = setup.Device.choose(cfg, distributed.Dist())
    assert (dev.name, dev.dtype, dev.compile) == ("cuda", torch.float16, True)
    assert torch.backends.cuda.matmul.fp32_precision == "tf32"  # the new API on torch >= 2.9, no legacy flag
    assert torch.backends.cudnn.conv.fp32_precision == "tf32"


def test_fsdp_on_an_old_gpu_names_float32(gpu_with_capability, tmp_path):
    gpu_with_capability(7, 0)
    from gptkit.ops.errors import UserError
    from gptkit.train import fsdp

    with pytest.raises(UserError, match="compute capability below 8.0.*--dtype=float32"):
        fsdp.check_settings("fsdp", True, gdevice.training_dtype("auto", "cuda"))


def test_newton_schulz_in_float16_survives_a_gradient_whose_norm_overflows_float16(monkeypatch):
    """On a V100 the iteration runs in float16, whose largest value is 65504: the
    gradient is normalised before the cast, or its norm would be inf (and the update NaN)."""
    monkeypatch.setattr(muon, "matmul_dtype", lambda device: torch.float16)
    torch.manual_seed(0)
    G = 1000 * torch.randn(256, 128)  # Frobenius norm ~1.8e5
    assert G.norm() > torch.finfo(torch.float16).max
    X = muon.orthogonalize(G)
    assert X.dtype == torch.float32 and torch.isfinite(X).all()
    s = torch.linalg.svdvals(X)
    assert 0.6 < s.min() and s.max() < 1.3
    monkeypatch.setattr(muon, "matmul_dtype", lambda device: torch.float32)
    assert torch.allclose(X, muon.orthogonalize(G), atol=2e-2)  # the float32 iteration, to float16's precision


@pytest.mark.parametrize("flags, native", [("fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni", True),
                                           ("fpu sse2 avx2 amx_tile amx_bf16", True),
                                           ("fpu sse2 avx2 avx512f avx512bw", False)])
def test_the_ten_minute_config_trains_in_bfloat16_only_where_the_cpu_has_its_instructions(
        flags, native, tmp_path, monkeypatch):
    """cpu_computes_bf16 reads /proc/cpuinfo's flags (AVX-512 BF16 or AMX); the ten-minute
    config autocasts to bfloat16 with the matmul attention (and a stronger weight decay for
    its extra steps) there, and keeps float32 with SDPA elsewhere (bfloat16 emulated is
    slower than float32)."""
    import builtins
    import io

    from gptkit.config import read_config_file

    real_open = builtins.open
    cpuinfo = f"processor\t: 0\nmodel name\t: a CPU\nflags\t\t: {flags}\n\n"
    monkeypatch.setattr(builtins, "open", lambda path, *a, **k: io.StringIO(cpuinfo) if path == "/proc/cpuinfo"
                        else real_open(path, *a, **k))
    assert gdevice.cpu_computes_bf16() is native
    settings = read_config_file(REPO / "configs" / "shakespeare_1200cpus.py")
    chosen = (settings.get("dtype", "auto"), settings.get("attention", "sdpa"), settings["muon_weight_decay"],
              settings["time_budget"], settings["n_layer"], settings["n_embd"])
    assert chosen == (("bfloat16", "matmul", 0.3, 1176.0, 4, 128) if native else ("auto", "sdpa", 0.1, 1160.0, 3, 128))
    monkeypatch.setattr(builtins, "open", lambda path, *a, **k: (_ for _ in ()).throw(OSError("no such file"))
                        if path == "/proc/cpuinfo" else real_open(path, *a, **k))
    assert gdevice.cpu_computes_bf16() is False  # not Linux: float32, as before


@pytest.mark.parametrize("capability, native", [("avx2", False), ("AVX2", False), ("default", False), ("avx512", True)])
def test_torchs_kernels_held_to_avx2_count_as_a_cpu_without_bfloat16(monkeypatch, capability, native):
    """ATEN_CPU_CAPABILITY=avx2 (how an AVX2 laptop's figures are measured on a newer CPU)
    makes the recipes take their float32 branch, as on the laptop."""
    import builtins
    import io

    real_open = builtins.open
    cpuinfo = "processor\t: 0\nflags\t\t: avx2 avx512f avx512_bf16\n\n"
    monkeypatch.setattr(builtins, "open", lambda path, *a, **k: io.StringIO(cpuinfo) if path == "/proc/cpuinfo"
                        else real_open(path, *a, **k))
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", capability)
    assert gdevice.cpu_computes_bf16() is native


GLIBC_ACCOUNTS_FOR_A_LARGE_TENSOR = r"""
import ctypes, sys, torch
from gptkit.ops.device import keep_freed_memory
class Mallinfo2(ctypes.Structure):  # glibc's struct mallinfo2 (malloc.h), all size_t
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                      "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Mallinfo2
if sys.argv[1] == "keep":
    print(keep_freed_memory(), file=sys.stderr)
before = libc.mallinfo2().hblkhd  # bytes in blocks mmap gave
x = torch.ones(5 << 20)  # 20 MB, as a step's activations
mapped = libc.mallinfo2().hblkhd - before
del x
print(mapped >> 20, libc.mallinfo2().fordblks >> 20)  # MB mapped for it, MB of free heap kept
"""


@pytest.mark.skipif(not gdevice.runs_on_glibc(), reason="glibc's malloc")
def test_keep_freed_memory_keeps_a_steps_large_tensors_for_the_next():
    """By glibc's own accounts (mallinfo2): by default a 20 MB tensor is mmap'ed and
    handed back to the kernel when freed (the next step faults its pages in again);
    after keep_freed_memory it comes from the heap and stays there, free, for the next."""
    def accounts(mode):
        run = subprocess.run([sys.executable, "-c", GLIBC_ACCOUNTS_FOR_A_LARGE_TENSOR, mode], cwd=REPO,
                             capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if "mallinfo2" in run.stderr:
            pytest.skip("glibc before 2.33: no mallinfo2")
        assert run.returncode == 0, run.stderr
        mapped, kept = map(int, run.stdout.split())
        return mapped, kept, run.stderr

    mapped, kept, _ = accounts("default")
    assert mapped >= 20 and kept < 20
    mapped, kept, note = accounts("keep")
    assert "glibc keeps freed blocks" in note
    assert mapped == 0 and kept >= 20


def test_keep_freed_memory_leaves_other_c_libraries_and_the_users_settings_alone(monkeypatch):
    monkeypatch.setattr(platform, "system", lambda: "Linux")
    monkeypatch.setattr(platform, "libc_ver", lambda: ("glibc", "2.36"))
    monkeypatch.setattr(gdevice.ctypes, "CDLL", lambda name: pytest.fail("mallopt called"))
    for name in [n for n in os.environ if n.startswith("MALLOC_")] + ["GLIBC_TUNABLES"]:
        monkeypatch.delenv(name, raising=False)
    for name, value in (("MALLOC_ARENA_MAX", "2"), ("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=131072")):
        monkeypatch.setenv(name, value)
        assert gdevice.keep_freed_memory() == "memory: glibc's malloc as the environment sets it"
        monkeypatch.delenv(name)
    monkeypatch.setattr(platform, "libc_ver", lambda: ("", ""))  # musl
    assert gdevice.keep_freed_memory() is None
    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    assert gdevice.keep_freed_memory() is None


def test_a_cuda_build_on_a_machine_without_a_gpu_is_named_with_the_cpu_builds_install(monkeypatch):
    """pip's default torch on Linux is a CUDA build; on a machine without a GPU train.py's
    header says so in one line, with the command that installs the CPU build (the one
    our CPU figures come from); a CPU build, or a CUDA build with a GPU, says nothing."""
    cpu = torch.device("cpu")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    note = gdevice.cuda_build_on_a_cpu_note(cpu)
    assert note.startswith(f"note: torch {torch.__version__} is a CUDA build and this machine has no CUDA GPU")
    assert note.endswith("pip install torch --index-url https://download.pytorch.org/whl/cpu") and "\n" not in note
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert gdevice.cuda_build_on_a_cpu_note(cpu) is None  # a GPU is there: the user chose the CPU
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gdevice.cuda_build_on_a_cpu_note(cpu) is None  # the CPU build


def test_train_py_prints_the_cuda_build_note_in_its_header(monkeypatch, tmp_path):
    import types

    from model import GPT, GPTConfig

    seen = []
    monkeypatch.setattr(setup, "cuda_build_on_a_cpu_note", lambda device: seen.append(device) or "note: CUDA build")
    raw = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=5))
    dev = types.SimpleNamespace(name="cpu", compile=False, memory=None)
    cfg = types.SimpleNamespace(init_from="scratch")
    lines = setup.header({"dtype": "float32"}, raw, types.SimpleNamespace(world_size=1), dev, cfg)
    assert "note: CUDA build" in lines and seen == [torch.device("cpu")]
