"""Opening files that came from someone else: a dataset folder or a checkpoint
folder copied from a colleague, unpacked from an archive, or half-copied.

    fd = open_regular(folder / "tokenizer.json", max_bytes=64 << 20)
    path = inside(folder, meta["tokenizer"]["file"], "meta.json's tokenizer file")  # its real path

Such a folder can hold what an ordinary file name does not warn of: a FIFO
(opening it for reading blocks until someone writes: a load that hangs forever),
a device, a symbolic link to a file elsewhere, or a name like `../../x` or an
absolute path. Each file is therefore looked at with `lstat` before it is opened,
opened without following links and without blocking, and looked at again through
the open descriptor (a file swapped in between is noticed). (No torch here:
prepare.py imports this.)
"""

import os
import stat
from pathlib import Path

from gptkit.ops.errors import UserError

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def kind_of(mode):
    """'a FIFO (named pipe)', 'a symbolic link', ... for a non-regular st_mode."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_regular(path, max_bytes=None, dir_fd=None, what=None):
    """A read-only descriptor of the regular file `path` (relative to dir_fd when given).

    A missing file is FileNotFoundError (the caller knows what to advise); anything
    that is not a regular file, or is larger than max_bytes, is a UserError naming it."""
    name = what or str(path)
    info = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
    if not stat.S_ISREG(info.st_mode):
        raise UserError(f"{name} is {kind_of(info.st_mode)}, not a regular file: refusing to read it")
    if max_bytes is not None and info.st_size > max_bytes:
        raise UserError(f"{name} is {info.st_size:,} bytes, more than the {max_bytes:,} such a file can be: refusing to read it")
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, dir_fd=dir_fd)
    opened = os.fstat(fd)
    if not stat.S_ISREG(opened.st_mode) or (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino):
        os.close(fd)
        raise UserError(f"{name} was replaced while it was opened: refusing to read it")
    return fd


def read_regular(path, max_bytes, what=None):
    """The bytes of the regular file `path` (at most max_bytes); see open_regular."""
    with os.fdopen(open_regular(path, max_bytes, what=what), "rb") as f:
        return f.read(max_bytes + 1)[:max_bytes]


def inside(folder, name, what):
    """The real path of folder/name, after checking that `name` stays inside `folder`:
    a relative path without `..`, which (symbolic links resolved) still lies in it."""
    if not isinstance(name, str) or not name or "\0" in name:
        raise UserError(f"{what} must be a file name, not {str(name)[:100]!r}")
    relative = Path(name)
    if relative.is_absolute() or ".." in relative.parts:
        raise UserError(f"{what} {name!r} must name a file inside {folder} (no absolute path, no '..'): refusing to read it")
    path, real_folder = Path(folder) / relative, Path(folder).resolve()
    real = path.resolve()
    if not real.is_relative_to(real_folder):
        raise UserError(f"{path} is a symbolic link to {real}, outside {folder}: refusing to read it")
    return real


def regular_size(path, what=None):
    """The size of `path` (not following a final link), which must be a regular file;
    FileNotFoundError when it is missing."""
    info = os.stat(path, follow_symlinks=False)
    if not stat.S_ISREG(info.st_mode):
        raise UserError(f"{what or path} is {kind_of(info.st_mode)}, not a regular file: refusing to read it")
    return info.st_size
