"""gptkit/fast/int8_kernel.c, compiled for this CPU on first use and called through ctypes:
the int8 products of cpu_linears.Int8Linear on a CPU with AVX2, AVX-VNNI or AVX-512 VNNI.

    kernel, why_not = int8_kernel.load()   # (the library, None) or (None, one line why not)

PyTorch's core int8 products for one row of inputs (torch._weight_int8pack_mm,
torch._int_mm, oneDNN's prepacked qlinear, an inductor-compiled reduction) all ran
near float16's speed on this project's CPUs (BENCHMARKS.md's route table): they read
a quarter of the bytes but spend the time saved converting them. The C file is the
product written out with the instruction made for it (vpdpbusd: 64 byte products a
step; on AVX2, vpmaddubsw and vpmaddwd: 32 a step), ~90 lines.

The library is built once per source, compiler and CPU with `$CC` (default `cc`)
`-O3 -march=native` (`$GPTKIT_INT8_ARCH` replaces `-march=native`: `-march=x86-64-v3`
builds the AVX2 path on any newer CPU, as an AVX2 laptop runs it) into gptkit's cache folder (gptkit/ops/paths.py's cache_dir:
$GPTKIT_CACHE_DIR/int8_kernel, default ~/.cache/gptkit/int8_kernel), written beside
and renamed into place, so processes building at once never load a half-written file. No compiler, a failed build or a
CPU without AVX2: `load` says why in one line and Int8Linear keeps
torch._weight_int8pack_mm. The kernel runs on one thread; with more torch threads
Int8Linear uses PyTorch's threaded product.
"""

import ctypes
import functools
import hashlib
import os
import platform
import shlex
import subprocess
from pathlib import Path

from gptkit.ops.paths import cache_dir, temp_path

SOURCE = Path(__file__).with_name("int8_kernel.c")
FLAGS = ["-O3", "-shared", "-fPIC"]
BUILD_SECONDS = 120
# kernel_isa()'s answer: the instructions the library was built for, and the /proc/cpuinfo
# flags this CPU must have to run it (a library built with $GPTKIT_INT8_ARCH for more than
# the CPU has would stop the process at its first instruction).
ISAS = {3: ("AVX-512 VNNI", {"avx512f", "avx512bw", "avx512_vnni"}), 2: ("AVX-VNNI", {"avx2", "avx_vnni"}),
        1: ("AVX2", {"avx2"})}


def arch_flags():
    """The instruction set the library is built for: -march=native, or $GPTKIT_INT8_ARCH."""
    return shlex.split(os.environ.get("GPTKIT_INT8_ARCH", "-march=native"))


def cpu_flags():
    """The CPU's feature flags (what -march=native compiles for), or its name where /proc is absent."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.cache
def load():
    """(the ctypes library, None) where the kernel is built and this CPU runs it, else (None, why).
    The library's `isa` names the instructions it uses (AVX-512 VNNI, AVX-VNNI or AVX2)."""
    compiler, arch = shlex.split(os.environ.get("CC", "cc")), arch_flags()
    key = hashlib.sha256("\0".join([SOURCE.read_text(), *compiler, *arch, *FLAGS, cpu_flags()]).encode())
    library = cache_dir("int8_kernel") / f"int8_kernel-{key.hexdigest()[:16]}.so"
    if not library.is_file():
        why = build(compiler, arch, library)
        if why:
            return None, why
    try:
        kernel = ctypes.CDLL(str(library))
    except OSError as e:
        return None, f"{library} does not load ({e})"
    isa = kernel.kernel_isa()
    if isa not in ISAS:
        return None, f"this CPU has no AVX2 (the library was built with {shlex.join(arch)})"
    name, needs = ISAS[isa]
    missing = needs - set(cpu_flags().split())
    if missing:
        return None, f"built with {shlex.join(arch)} for {name}, which this CPU lacks ({', '.join(sorted(missing))})"
    kernel.isa = name
    pointer = ctypes.c_void_p
    kernel.int8_linear.restype = ctypes.c_int
    kernel.int8_linear.argtypes = [pointer, ctypes.c_int, ctypes.c_int, pointer, pointer, pointer, pointer,
                                   ctypes.c_int, pointer]
    return kernel, None


def build(compiler, arch, library):
    """Compile SOURCE into `library`; None, or why it could not be built (one line)."""
    tmp = temp_path(library)
    command = [*compiler, *arch, *FLAGS, str(SOURCE), "-o", str(tmp)]
    try:
        library.parent.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_SECONDS)
        if done.returncode != 0:
            first = (done.stderr.strip().splitlines() or ["no message"])[0]
            return f"`{shlex.join(compiler)}` failed to build it ({first})"
        os.replace(tmp, library)
        return None
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`{shlex.join(compiler)}` could not build it in {library.parent} ({type(e).__name__}: {e})"
    finally:
        tmp.unlink(missing_ok=True)
