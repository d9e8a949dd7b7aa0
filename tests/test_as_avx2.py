"""scripts/as_avx2.sh: a command run as on an AVX2 laptop (BENCHMARKS.md's "on AVX2" figures)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "as_avx2.sh"
PROBE = ("import os, torch; from gptkit.ops.device import cpu_computes_bf16; "
         "print(torch.backends.cpu.get_cpu_capability(), os.environ['GPTKIT_INT8_ARCH'], cpu_computes_bf16())")


def avx2_cpu():
    try:
        return " avx2 " in " " + Path("/proc/cpuinfo").read_text() + " "
    except OSError:
        return False


@pytest.mark.skipif(not avx2_cpu(), reason="needs an x86 CPU with AVX2 (Linux)")
def test_torch_runs_its_avx2_kernels_int8_builds_for_x86_64_v3_and_the_recipes_take_float32():
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "GPTKIT_INT8_ARCH")}
    out = subprocess.run([str(SCRIPT), sys.executable, "-c", PROBE], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["AVX2", "-march=x86-64-v3", "False"]


def test_a_llama_cpp_folder_without_the_package_is_one_line_and_exit_2(tmp_path):
    out = subprocess.run([str(SCRIPT), "true"], env=dict(os.environ, LLAMA_CPP_AVX2=str(tmp_path)),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert out.stderr.startswith(f"error: LLAMA_CPP_AVX2={tmp_path} holds no llama_cpp package")
