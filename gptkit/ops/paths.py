"""Claiming an output path before any heavy work, and temporary names that always fit.

    dest = claim_output("ckpt-xl.pt", "file", what="DEST")                    # convert.py --to pt
    folder = claim_output("data/mine", "folder", overwrite=True, what="--name")  # prepare.py

Every command that writes calls `claim_output` first, before it reads a corpus or
loads a model, so that a destination that cannot work is refused in one line
(UserError, exit 2) instead of a traceback after minutes of work:

    not valid UTF-8        a byte like 0xFF in the name (Python keeps it as a lone surrogate):
                           messages, meta.json and config.json could not hold it
    too long               a name component over NAME_MAX bytes (255) or the whole path over
                           PATH_MAX (4096): the system refuses to create it
    the wrong kind         a file wanted where a folder is (or a symlink to one), a device or
                           FIFO such as /dev/full, a file where a folder is wanted
    already there          a file, a non-empty folder or a symlink of any kind (to nothing
                           included) that would be overwritten or written through, unless
                           `overwrite` says the command replaces what is there on purpose
    not writable           tried by creating (and removing) a temporary file where the
                           command will write: os.access() says yes to root, but a read-only
                           file system or an immutable (chattr +i) folder refuses root too

A folder claimed with overwrite=False is created whole by the command (a new or an
empty folder, written beside it and renamed); with overwrite=True the command
writes into it (a dataset or run folder: the command decides which files it
replaces). A full disk during the write itself is the environment failing: the
writers (gptkit/ops/checkpoint.py) report it in one line with exit 1 and remove
their temporary file.

Temporary files are `.<name>.tmp-<pid>[-<hex>]` (gptkit/ops/lock.py cleans up the ones a
killed process leaves); `temp_name` shortens the name part, with a hash to keep it
unique, when the whole would exceed NAME_MAX.
"""

import errno
import hashlib
import os
import secrets
import stat
from pathlib import Path

from gptkit.ops.errors import RunFailed, UserError

NAME_MAX = 255  # bytes in one path component on Linux, macOS and Windows file systems
PATH_MAX = 4096  # bytes in a whole path on Linux
TEMP_MARK = ".tmp-"


def shown(path, limit=160):
    """The path as text that can always be printed (a non-UTF-8 byte as \\xff), its middle
    elided past `limit` characters so that a message stays one readable line."""
    text = os.fsencode(str(path)).decode("utf-8", "backslashreplace")
    return text if len(text) <= limit else f"{text[:limit // 2]}...{text[-limit // 4:]}"


def cache_dir(name):
    """gptkit's cache folder for `name` (downloads, a measured peak, a built kernel):
    $GPTKIT_CACHE_DIR/name, else $XDG_CACHE_HOME/gptkit/name, else ~/.cache/gptkit/name."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(os.environ.get("GPTKIT_CACHE_DIR") or Path(base) / "gptkit") / name


def temp_name(name, tag):
    """`.<name>.tmp-<tag>`, with `name` cut (and a hash of it added) so the whole fits NAME_MAX."""
    full = f".{name}{TEMP_MARK}{tag}"
    if len(os.fsencode(full)) <= NAME_MAX:
        return full
    digest = hashlib.sha256(os.fsencode(name)).hexdigest()[:12]
    room = NAME_MAX - len(os.fsencode(f".~{digest}{TEMP_MARK}{tag}"))
    head = os.fsencode(name)[:room].decode("utf-8", "ignore")  # never half a character
    return f".{head}~{digest}{TEMP_MARK}{tag}"


def temp_path(path, tag=None):
    """A temporary sibling of `path` for this process (see temp_name)."""
    path = Path(path)
    return path.with_name(temp_name(path.name, tag or str(os.getpid())))


def claim_output(path, kind="file", overwrite=False, what="the output"):
    """Check that `path` can be written as a `kind` ("file" or "folder") and return it
    (a symlink's target, else the path as given); UserError naming the path and the fix."""
    assert kind in ("file", "folder"), kind
    path = Path(path)
    label = f"{what} {shown(path)}"
    try:
        os.fsencode(str(path)).decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{label}: the name is not valid UTF-8 (it holds a byte such as 0xFF): use a name in UTF-8")
    if not str(path):
        raise UserError(f"{what} is empty: give a path")
    real = Path(os.path.realpath(path))  # symlinks followed: where the bytes will really go
    name_max = _limit(real, "PC_NAME_MAX", NAME_MAX)
    for part in real.parts:
        if len(os.fsencode(part)) > name_max:
            raise UserError(f"{label}: a name in it is {len(os.fsencode(part))} bytes long; "
                            f"file names are at most {NAME_MAX} bytes: use a shorter name")
    if len(os.fsencode(str(real))) >= _limit(real, "PC_PATH_MAX", PATH_MAX):
        raise UserError(f"{label}: the path is {len(os.fsencode(str(real)))} bytes long, over the system's limit of "
                        f"{PATH_MAX}: use a shorter path")
    try:
        st = os.stat(real)
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        raise UserError(f"{label}: {shown(_file_above(real))} is not a folder: choose another path")
    except OSError as e:
        raise UserError(f"cannot use {label}: {e.strerror}")
    if st is not None:
        if kind == "file" and stat.S_ISDIR(st.st_mode):
            raise UserError(f"{label} is a folder{' (through a symlink)' if path.is_symlink() else ''}: "
                            f"give a file name, e.g. {shown(path / 'out')}")
        if kind == "file" and not stat.S_ISREG(st.st_mode):
            raise UserError(f"{label} is not a regular file (a device, FIFO or socket): give a file name to write")
        if kind == "folder" and not stat.S_ISDIR(st.st_mode):
            raise UserError(f"{label} exists and is not a folder: choose another path or remove it")
        if not overwrite and (kind == "file" or any(real.iterdir())):
            what_is = "" if kind == "file" else " and is not empty"
            raise UserError(f"{label} already exists{what_is}: give a new {kind} name or remove it (nothing is overwritten)")
    if not overwrite and os.path.islink(path):  # a symlink, even one to nothing (which exists() denies)
        target = os.readlink(path)
        dangling = "" if os.path.exists(path) else ", which does not exist"
        raise UserError(f"{label} already exists (a symlink to {shown(target)}{dangling}): give a new {kind} name "
                        "or remove it (nothing is written through a symlink)")
    if kind == "folder" and st is not None and overwrite:
        _check_writable(real, label)  # written into
    else:
        parent = _existing_ancestor(real.parent, label)
        if parent != real.parent and (kind == "file" or not overwrite):  # a run or dataset folder makes its parents
            raise UserError(f"cannot write {label}: the folder {shown(real.parent)} does not exist: create it first")
        _check_writable(parent, label)  # created there, or a temporary file renamed there
    return real if path.is_symlink() else path


def _limit(path, name, default):
    """os.pathconf for the nearest existing folder of `path`."""
    for folder in (path, *path.parents):
        try:
            return os.pathconf(folder, name)
        except (OSError, ValueError):  # not there (yet), or itself too long
            continue
    return default


def _file_above(path):
    """The first component of `path` that exists and is not a folder."""
    for ancestor in reversed((path, *path.parents)):
        if ancestor.exists() and not ancestor.is_dir():
            return ancestor
    return path


def _existing_ancestor(folder, label):
    """`folder`, or its nearest ancestor that exists (the command creates the rest)."""
    for ancestor in (folder, *folder.parents):
        if ancestor.is_dir():
            return ancestor
        if ancestor.exists() or ancestor.is_symlink():
            raise UserError(f"{label}: {shown(ancestor)} is not a folder: choose another path")
    return folder  # unreachable: "/" exists


def _check_writable(folder, label):
    """Create and remove a temporary file in `folder`: the only test that holds for root."""
    probe = folder / temp_name("claim", f"{os.getpid()}-{secrets.token_hex(4)}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise RunFailed(f"cannot write {label}: no space left in {shown(folder)}: free some space")
        why = {errno.EROFS: "is on a read-only file system", errno.EACCES: "is not writable (permissions)",
               errno.EPERM: "does not allow new files (permissions, or marked immutable)"}
        reason = why.get(e.errno, f"cannot be written ({e.strerror})")
        raise UserError(f"cannot write {label}: the folder {shown(folder)} {reason}: choose a folder you can write to")
    os.close(fd)
    os.unlink(probe)
