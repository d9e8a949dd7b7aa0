"""Writing a file or a folder so that nobody ever sees it half-written: one helper for every writer.

    with atomic_write(run / "ckpt.pt") as tmp:        # replaces the run's previous checkpoint
        torch.save(obj, tmp)
    with atomic_write(dest, replace=False) as tmp:    # a new file: never replaces one that appeared meanwhile
        write_gguf(tmp, ...)
    with atomic_write(dest, replace=False, folder=True) as tmp:   # a new folder (convert.py --to hf)
        save_file(weights, tmp / "model.safetensors")

The data goes to a temporary sibling (`.<name>.tmp-<pid>`, gptkit/ops/paths.py), is
flushed to the disk (fsync), and is published with a rename in the same folder,
which is atomic: a reader sees the old file or the new one, never part of either.
The folder is then fsynced too, so that the rename itself survives a power cut.

replace=True is for files a command replaces on purpose (a run's checkpoints,
config.json, a plot it redraws). replace=False is for a destination the command
claimed as new (gptkit/ops/paths.py's claim_output): it publishes with a rename that
fails when the destination exists (Linux's renameat2 with RENAME_NOREPLACE; where
that is missing, a hard link then the temporary's removal for a file, a plain
rename, which never replaces a folder holding files, for a folder). A file that
appeared after the claim (a second conversion to the same name, another program)
is left untouched, and the command stops with one line (UserError, exit 2).

Whatever ends the write early (an error, a full disk, Ctrl-C, SIGTERM) removes the
temporary; one that a killed writer (kill -9) left is removed by the next write of
the same name. SIGTERM's default would end the process on the spot, leaving it behind;
while a temporary exists it raises SystemExit(143) instead, unless the program has
a SIGTERM handler of its own (training stops cleanly at the end of a step).
"""

import contextlib
import ctypes
import errno
import functools
import os
import shutil
import signal
import threading
from pathlib import Path

from gptkit.ops.errors import RunFailed, UserError
from gptkit.ops.lock import TEMP_PATTERN, pid_alive
from gptkit.ops.paths import shown, temp_name, temp_path

AT_FDCWD = -100
RENAME_NOREPLACE = 1
TERMINATED = 128 + signal.SIGTERM  # the exit status a shell reports for a SIGTERM


class Appeared(UserError):
    """The destination was created by someone else while this command wrote it."""


@contextlib.contextmanager
def atomic_write(path, replace=True, folder=False, what="", kept="nothing was left behind"):
    """Yield a temporary Path beside `path` to write (a file, or with folder=True an
    empty folder to fill), and publish it at `path` when the block ends without an
    error; see the module's docstring. An OSError (a full disk), in the block or in
    publishing, is one RunFailed line, "could not write {what}{path}: ... ({kept})"."""
    path = Path(path)
    tmp = temp_path(path)
    restore = terminate_by_exception()
    try:
        _remove(tmp)  # a leftover of an earlier process with this pid
        remove_stale_temporaries(path)  # those of killed writers of this name (kill -9 runs no clean-up)
        if folder:
            tmp.mkdir()
        yield tmp
        fsync_tree(tmp)
        publish(tmp, path, replace=replace)
        fsync_dir(path.parent)
    except OSError as e:  # the machine's state, not the user's input
        raise RunFailed(f"could not write {what}{shown(path)}: {e.strerror or e} ({kept})") from e
    finally:
        _remove(tmp)  # gone already once published
        if restore is not None:
            restore()


def remove_stale_temporaries(path):
    """Remove the temporaries (files or folders) of `path` that a writer left when it was
    killed (SIGKILL, a power cut): `.<name>.tmp-<pid>[-<hex>]` whose process is gone.
    A live process's are kept. Returns the names removed."""
    path = Path(path)
    removed = []
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return removed
    for entry in entries:
        match = TEMP_PATTERN.match(entry.name)
        if not match:
            continue
        pid, tag = int(match.group(1)), match.group(1) + (match.group(2) or "")
        if entry.name != temp_name(path.name, tag) or pid == os.getpid() or pid_alive(pid):
            continue
        _remove(Path(entry.path))
        removed.append(entry.name)
    return removed


def publish(tmp, dest, replace=True):
    """Rename `tmp` (a file or folder) to `dest` in one step. replace=False never replaces
    what is at `dest` (an empty folder there, left by a claim, is taken): Appeared if a
    file or a folder with files is there."""
    tmp, dest = Path(tmp), Path(dest)
    if replace:
        os.replace(tmp, dest)
        return
    if tmp.is_dir() and dest.is_dir() and not dest.is_symlink():
        try:
            dest.rmdir()  # the empty folder the claim accepted
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            raise _appeared(dest) from None
    try:
        if _rename_noreplace(tmp, dest):
            return
        if tmp.is_dir():
            os.rename(tmp, dest)  # refused by the system when a file, or a folder with files, is there
        else:
            os.link(tmp, dest)  # fails when dest exists
            os.unlink(tmp)
    except (FileExistsError, IsADirectoryError, NotADirectoryError) as e:
        raise _appeared(dest) from e
    except OSError as e:
        if e.errno == errno.ENOTEMPTY:
            raise _appeared(dest) from e
        raise


def _appeared(dest):
    return Appeared(f"{shown(dest)} appeared while this command was writing it (a second command writing the same "
                    f"name, or another program): it is left as it is, and nothing was written; choose another name")


def _rename_noreplace(src, dst):
    """renameat2(RENAME_NOREPLACE): True when done; False where the system or the file
    system does not offer it; FileExistsError when dst exists."""
    rename = getattr(_libc(), "renameat2", None)
    if rename is None:
        return False
    if rename(AT_FDCWD, os.fsencode(src), AT_FDCWD, os.fsencode(dst), RENAME_NOREPLACE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(dst))


@functools.cache
def _libc():
    """The C library with renameat2's signature set, or None (not a POSIX system)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    rename = getattr(libc, "renameat2", None)
    if rename is not None:
        rename.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        rename.restype = ctypes.c_int
    return libc


def fsync_tree(path):
    """fsync a file, or every file in a folder and the folder."""
    path = Path(path)
    if path.is_dir():
        for child in path.rglob("*"):
            if child.is_file() and not child.is_symlink():
                _fsync_file(child)
        fsync_dir(path)
    else:
        _fsync_file(path)


def _fsync_file(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(folder):
    """Make a rename in `folder` durable (POSIX); a no-op where folders can't be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove(path):
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass


def terminate_by_exception():
    """While a temporary exists, SIGTERM raises SystemExit(143) (so that the temporary is
    removed) where it would end the process on the spot; returns the undo, or None."""
    if threading.current_thread() is not threading.main_thread():
        return None
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return None  # the program's own handler (train.py stops at the end of a step)

    def terminated(signum, frame):
        raise SystemExit(TERMINATED)

    signal.signal(signal.SIGTERM, terminated)
    return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL)
