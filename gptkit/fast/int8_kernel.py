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
builds the AVX2 path on any newer CPU, as an AVX2 laptop runs it) into gptkit's cache
folder (gptkit/ops/paths.py's cache_dir: $GPTKIT_CACHE_DIR/int8_kernel, default
~/.cache/gptkit/int8_kernel). Loading a library
runs its code, so a cached one is checked before it is loaded:

    the folder    a folder of this user's that no one else can write (not group- or
                  world-writable); else the kernel is not used, and the line says why
    the library   a regular file of this user's that no one else can write, whose sha256
                  is the one recorded beside it (int8_kernel-<key>.sha256) when it was
                  built here; else it is rebuilt, and one line on stderr says why. A
                  truncated, empty, foreign or planted library is never loaded.

A build writes the library and its record beside them and renames them into place,
under a lock on the folder (flock: a second process waits for the first build and
loads it). A failed or hung build (past BUILD_SECONDS, the compiler's whole process
group killed) is remembered in int8_kernel-<key>.failed, so that the next process does
not wait again: the line says to remove that file to try again (a new compiler or
source is another key, tried afresh). Whatever goes wrong, `load` says why in one line
and Int8Linear keeps torch._weight_int8pack_mm; so does a CPU without AVX2.
The kernel runs on one thread; with more torch threads Int8Linear uses PyTorch's
threaded product.
"""

import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import shlex
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from gptkit.ops.lock import remove_stale_temps
from gptkit.ops.paths import cache_dir, shown, temp_path

try:
    import fcntl
except ImportError:  # Windows: no flock; builds are then not serialised
    fcntl = None

SOURCE = Path(__file__).with_name("int8_kernel.c")
FLAGS = ["-O3", "-shared", "-fPIC"]
BUILD_SECONDS = 120
LOCK_NAME = ".int8_kernel.lock"
LOCK_MARGIN_SECONDS = 10  # waited past another process's BUILD_SECONDS before giving up on its lock
MISSING = "is not built yet"  # unverified()'s word for a first build: no line on stderr
# kernel_isa()'s answer: the instructions the library was built for, and the /proc/cpuinfo
# flags this CPU must have to run it (a library built with $GPTKIT_INT8_ARCH for more than
# the CPU has would stop the process at its first instruction).
ISAS = {3: ("AVX-512 VNNI", {"avx512f", "avx512bw", "avx512_vnni"}), 2: ("AVX-VNNI", {"avx2", "avx_vnni"}),
        1: ("AVX2", {"avx2"})}


class NotUsed(Exception):
    """Why the kernel is not used, in one line: load() returns it and torch's product runs."""


def say(line):
    print(line, file=sys.stderr)


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
    try:
        return checked_kernel(), None
    except NotUsed as e:
        return None, str(e)


def checked_kernel():
    """The kernel's library, verified (or built) in the cache folder and loaded; NotUsed why not."""
    compiler, arch = command_from("CC", "cc"), command_from("GPTKIT_INT8_ARCH", "-march=native")
    try:
        source = SOURCE.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise NotUsed(f"{shown(SOURCE)} cannot be read ({getattr(e, 'strerror', None) or e})")
    key = hashlib.sha256("\0".join([source, *compiler, *arch, *FLAGS, cpu_flags()]).encode()).hexdigest()[:16]
    folder = private_folder()
    library = folder / f"int8_kernel-{key}.so"
    with build_lock(folder):
        make_ready(compiler, arch, library)
        kernel = open_library(library)
    isa = kernel.kernel_isa()
    if isa not in ISAS:
        raise NotUsed(f"this CPU has no AVX2 (the library was built with {shlex.join(arch)})")
    name, needs = ISAS[isa]
    missing = needs - set(cpu_flags().split())
    if missing:
        raise NotUsed(f"built with {shlex.join(arch)} for {name}, which this CPU lacks ({', '.join(sorted(missing))})")
    kernel.isa = name
    pointer = ctypes.c_void_p
    kernel.int8_linear.restype = ctypes.c_int
    kernel.int8_linear.argtypes = [pointer, ctypes.c_int, ctypes.c_int, pointer, pointer, pointer, pointer,
                                   ctypes.c_int, pointer]
    return kernel


def command_from(variable, default):
    """$variable split as a shell would ($CC, $GPTKIT_INT8_ARCH), else `default`."""
    try:
        return shlex.split(os.environ.get(variable) or default)
    except ValueError as e:
        raise NotUsed(f"${variable} cannot be split into words ({e})")


def private_folder():
    """The cache folder (made if missing, symlinks resolved): this user's, writable by no one else."""
    try:
        folder = cache_dir("int8_kernel")
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        folder = Path(os.path.realpath(folder))
        why = not_private(os.stat(folder), stat.S_ISDIR, "a folder")
    except (FileExistsError, NotADirectoryError):
        blocking = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), folder)
        raise NotUsed(f"its cache folder cannot be made: {shown(blocking)} is not a folder "
                      "(set GPTKIT_CACHE_DIR to a folder of yours)")
    except (OSError, RuntimeError) as e:  # RuntimeError: no home folder to put ~/.cache in
        where = f" in {shown(e.filename)}" if getattr(e, "filename", None) else ""
        raise NotUsed(f"its cache folder cannot be made{where} ({getattr(e, 'strerror', None) or e}): "
                      "set GPTKIT_CACHE_DIR to a folder of yours")
    if why:
        raise NotUsed(f"its cache folder {shown(folder)} {why}: use a folder only you can write "
                      "(GPTKIT_CACHE_DIR)")
    return folder


def not_private(st, is_kind, kind):
    """Why a file or folder with this stat cannot be trusted to hold code we run, or None."""
    if not is_kind(st.st_mode):
        return f"is not {kind}"
    if st.st_uid != os.geteuid():
        return f"belongs to user {st.st_uid}, not to this user ({os.geteuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"can be written by others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


@contextlib.contextmanager
def build_lock(folder):
    """Hold flock on the folder's lock file while the library is checked, built and
    loaded: a second process waits for the first's build (BUILD_SECONDS at most) and
    finds it done. A folder where the lock file cannot be made (read-only) goes unlocked:
    nothing can be built there, a library already there is still checked."""
    try:
        fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError:
        fd = None
    try:
        if fd is not None and fcntl is not None:
            deadline = time.monotonic() + BUILD_SECONDS + LOCK_MARGIN_SECONDS
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        waited = BUILD_SECONDS + LOCK_MARGIN_SECONDS
                        raise NotUsed(f"another process has held {shown(folder / LOCK_NAME)} for over "
                                      f"{waited} s (a build that does not end): not waiting longer")
                    time.sleep(0.05)
            remove_stale_temps(folder)  # a build killed midway (kill -9) leaves its temporary files
        yield
    finally:
        if fd is not None:
            os.close(fd)  # drops the lock


def make_ready(compiler, arch, library):
    """Leave `library` verified: built if missing, rebuilt (one line on stderr) if it fails
    its check; NotUsed where a build failed, now or before (remembered), or cannot be made."""
    failed = library.with_suffix(".failed")
    if failed.is_file():
        with open(failed, "rb") as f:
            why = f.read(300).decode(errors="replace").strip() or "no message"
        raise NotUsed(f"its build failed in an earlier run ({why}): remove {shown(failed)} to try again")
    why = unverified(library)
    if why is None:
        return
    try:
        build(compiler, arch, library, failed)
    except NotUsed as e:
        raise NotUsed(str(e) if why == MISSING else f"the cached {shown(library)} {why}, and {e}")
    if why != MISSING:
        say(f"decode: gptkit/fast/int8_kernel.c's cached {shown(library)} {why}: rebuilt")


def unverified(library):
    """Why `library` may not be loaded (MISSING where nothing is there yet), or None."""
    record = library.with_suffix(".sha256")
    try:
        st = os.lstat(library)
    except FileNotFoundError:
        return MISSING
    why = not_private(st, stat.S_ISREG, "a regular file")
    if why:
        return why
    try:
        why = not_private(os.lstat(record), stat.S_ISREG, "a regular file")
        with open(record, "rb") as f:
            recorded = f.read(100).decode(errors="replace").strip()
    except FileNotFoundError:
        return "has no record of its sha256 (a library not built here)"
    if why:
        return f"has a record that {why}"
    if sha256(library) != recorded:
        return "does not match the sha256 recorded when it was built (truncated or replaced)"
    return None


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def build(compiler, arch, library, failed):
    """Compile SOURCE into `library` and record its sha256 beside it, both written beside and
    renamed; NotUsed why not (a compiler's failure or hang is remembered in `failed`)."""
    tmp, record = temp_path(library), library.with_suffix(".sha256")
    record_tmp, named = temp_path(record), f"`{shlex.join(compiler)}`"
    try:
        tmp.touch(mode=0o600)  # a folder we cannot write says so here, not as a compiler's failure
        status, errors = run_compiler([*compiler, *arch, *FLAGS, str(SOURCE), "-o", str(tmp)])
        if status != 0 or tmp.stat().st_size == 0:
            first = (errors.strip().splitlines() or ["no message" if status else "it wrote nothing"])[0]
            remember(failed, f"{named} failed to build it ({first})")
        record_tmp.write_text(sha256(tmp) + "\n")
        os.chmod(tmp, 0o755)  # the compiler's mode follows the umask: never writable by others
        os.replace(tmp, library)
        os.replace(record_tmp, record)
    except subprocess.TimeoutExpired:
        remember(failed, f"{named} did not finish building it in {BUILD_SECONDS} s")
    except OSError as e:
        if e.filename == compiler[0]:  # not there, or not a program: quick to find again, not remembered
            raise NotUsed(f"no compiler {named} ({e.strerror}): install one, or name it in $CC")
        why = f"{type(e).__name__}: {e.strerror or e}"
        raise NotUsed(f"{named} could not build it in {shown(library.parent)} ({why})")
    finally:
        tmp.unlink(missing_ok=True)
        record_tmp.unlink(missing_ok=True)


def run_compiler(command):
    """(exit status, stderr) of the compiler, started in a session of its own so that a
    hang past BUILD_SECONDS ends with everything it started (cc1, as, ld)."""
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True)
    try:
        _, errors = process.communicate(timeout=BUILD_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    return process.returncode, errors


def remember(failed, why):
    """Write why the build failed to `failed` (written beside and renamed), then NotUsed."""
    tmp = temp_path(failed)
    try:
        tmp.write_text(why + "\n")
        os.replace(tmp, failed)
        remembered = f" (remembered: remove {shown(failed)} to try again)"
    except OSError:
        tmp.unlink(missing_ok=True)
        remembered = ""
    raise NotUsed(why + remembered)


def open_library(library):
    """The verified library loaded, holding both functions the kernel has; NotUsed why not."""
    try:
        kernel = ctypes.CDLL(str(library))
        kernel.kernel_isa, kernel.int8_linear
    except OSError as e:
        raise NotUsed(f"{shown(library)} does not load ({e})")
    except AttributeError as e:
        raise NotUsed(f"{shown(library)} is not gptkit/fast/int8_kernel.c's build ({e})")
    return kernel
