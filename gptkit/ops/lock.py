"""One writer per folder: a lock that a killed process cannot leave behind, and
the clean-up of the temporary files such processes do leave.

    with FolderLock("out-shakespeare", "training run"):
        ...  # the only process writing there

The lock is `flock` on `<folder>/.lock`: the kernel holds it for the process and
drops it when the process ends however it ends (exit, crash, kill -9), so a stale
lock never blocks the next run; after a power loss there is no lock at all. The
file keeps the holder's pid, host and start time, only to name it in the message a
second writer gets. (flock is advisory and local: it does not protect a folder
shared over NFS between machines.)

Temporary files are `.<name>.tmp-<pid>[-<random>]` (gptkit/ops/atomic.py writes them): one
whose process is gone was never renamed into place, and is deleted at the next start.
(No torch here: prepare.py imports this.)
"""

import json
import os
import re
import socket
import time
from pathlib import Path

from gptkit.ops.errors import UserError

try:
    import fcntl
except ImportError:  # Windows: no flock; the lock then only names the last holder
    fcntl = None

LOCK_NAME = ".lock"
TEMP_PATTERN = re.compile(r"^\..+\.tmp-(\d+)(-[0-9a-f]+)?$")


def pid_alive(pid):
    """True when a process with this pid exists (on this machine)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by someone else
        return True
    except OverflowError:
        return False
    return True


def remove_stale_temps(folder):
    """Delete the temporary files in `folder` whose writing process is gone; return
    their names. A live process's files (another writer's, or our own) are kept."""
    removed = []
    for path in Path(folder).iterdir():
        match = TEMP_PATTERN.match(path.name)
        if not match or not path.is_file():
            continue
        pid = int(match.group(1))
        if pid == os.getpid() or pid_alive(pid):
            continue
        path.unlink(missing_ok=True)
        removed.append(path.name)
    return removed


class FolderLock:
    """An exclusive lock on `folder` for as long as this object holds it."""

    def __init__(self, folder, what="run", elsewhere="use another folder"):
        self.folder = Path(folder)
        self.what = what
        self.elsewhere = elsewhere  # how to go on without waiting, for the message
        self.fd = None

    def acquire(self):
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / LOCK_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = _describe(os.pread(fd, 4096, 0))
                os.close(fd)
                raise UserError(
                    f"{self.folder} is in use by another {self.what}{holder}: wait for it to finish or stop it, "
                    f"or {self.elsewhere}"
                )
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        self.fd = fd
        return self

    def release(self):
        if self.fd is not None:
            os.close(self.fd)  # closing the file drops the flock
            self.fd = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


def _describe(raw):
    try:
        info = json.loads(raw.decode())
        return f" (pid {info['pid']} on {info['host']}, started {info['started']})"
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return ""
