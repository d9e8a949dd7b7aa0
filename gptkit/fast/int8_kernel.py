"""gptkit/fast/int8_kernel.c, compiled for this CPU on first use and called through ctypes:
the int8 products of cpu_linears.Int8Linear on a CPU with AVX-512 VNNI.

    kernel, why_not = int8_kernel.load()   # (the library, None) or (None, one line why not)

PyTorch's core int8 products for one row of inputs (torch._weight_int8pack_mm,
torch._int_mm, oneDNN's prepacked qlinear, an inductor-compiled reduction) all ran
near float16's speed on this project's CPUs (BENCHMARKS.md's route table): they read
a quarter of the bytes but spend the time saved converting them. The C file is the
product written out with the instruction made for it (vpdpbusd: 64 byte products a
step), ~60 lines.

The library is built once per source, compiler and CPU with `$CC` (default `cc`)
`-O3 -march=native` into gptkit's cache folder (gptkit/ops/paths.py's cache_dir:
$GPTKIT_CACHE_DIR/int8_kernel, default ~/.cache/gptkit/int8_kernel), written beside
and renamed into place, so processes building at once never load a half-written file. No compiler, a failed build or a
CPU without AVX-512 VNNI: `load` says why in one line and Int8Linear keeps
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
FLAGS = ["-O3", "-march=native", "-shared", "-fPIC"]
BUILD_SECONDS = 120


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
    """(the ctypes library, None) where the kernel is built and this CPU has VNNI, else (None, why)."""
    compiler = shlex.split(os.environ.get("CC", "cc"))
    key = hashlib.sha256("\0".join([SOURCE.read_text(), *compiler, *FLAGS, cpu_flags()]).encode()).hexdigest()[:16]
    library = cache_dir("int8_kernel") / f"int8_kernel-{key}.so"
    if not library.is_file():
        why = build(compiler, library)
        if why:
            return None, why
    try:
        kernel = ctypes.CDLL(str(library))
    except OSError as e:
        return None, f"{library} does not load ({e})"
    if not kernel.has_vnni():
        return None, "this CPU has no AVX-512 VNNI"
    pointer = ctypes.c_void_p
    kernel.int8_linear.restype = ctypes.c_int
    kernel.int8_linear.argtypes = [pointer, ctypes.c_int, ctypes.c_int, pointer, pointer, pointer, pointer,
                                   ctypes.c_int, pointer]
    return kernel, None


def build(compiler, library):
    """Compile SOURCE into `library`; None, or why it could not be built (one line)."""
    tmp = temp_path(library)
    command = [*compiler, *FLAGS, str(SOURCE), "-o", str(tmp), "-lm"]
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
