"""The run's out_dir, held by one writer from start to end (train.py takes it on rank 0
before anything else and releases it last):

    claim = OutDir(cfg)      # the lock, stale temporaries removed, no silent overwrite
    claim.release(ok=True)   # a failed run that saved nothing takes its files with it

An operator's concern, which a reader of the training step may skip."""

import shutil
import time

from gptkit.errors import UserError
from gptkit.lock import LOCK_NAME, FolderLock, remove_stale_temps
from gptkit.paths import claim_output
from gptkit.train import sharded


class OutDir:
    """The run's out_dir, held by one writer (rank 0) from start to end.

    Taking it: the one-writer lock (a second run on the same out_dir is refused,
    naming the process that holds it), the removal of temporary files left by
    killed runs, and the refusal to start a new run over an old one unless
    overwrite is set. Released at the end; a folder this run created and never
    wrote to is removed again."""

    RUN_FILES = ("ckpt.pt", "best.pt", "metrics.jsonl", "config.json")

    def __init__(self, cfg):
        # A folder (not a file), writable, with a name the system takes: else one line now.
        self.path = claim_output(cfg.out_dir, "folder", overwrite=True, what="out_dir")
        self.created = not self.path.exists()
        try:
            self.lock = FolderLock(self.path, "training run", "use another --out_dir").acquire()
        except OSError as e:
            raise UserError(f"cannot use out_dir {self.path}: {e.strerror or e}")
        try:
            removed = remove_stale_temps(self.path)
            if (self.path / sharded.TEMP).is_dir():  # a sharded save that died: we hold the lock, so no one writes it
                shutil.rmtree(self.path / sharded.TEMP)
                removed.append(sharded.TEMP)
            if removed:
                print(f"removed {len(removed)} temporary file(s) left in {self.path} by a run that was killed")
            if cfg.init_from != "resume":
                self._make_room(cfg.overwrite)
        except BaseException:
            self.release(ok=True)  # refused before anything was written: leave the folder as it was
            raise

    def _make_room(self, overwrite):
        held = [name for name in ("ckpt.pt", "best.pt", sharded.FOLDER, sharded.OLD) if (self.path / name).exists()]
        if held and not overwrite:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime((self.path / held[0]).stat().st_mtime))
            raise UserError(
                f"out_dir {self.path} already holds a run ({' and '.join(held)}, saved {when}): continue it with "
                f"--init_from=resume, start a new one with --out_dir=OTHER, or replace it with --overwrite=true"
            )
        for name in self.RUN_FILES:  # a run that saved no checkpoint leaves only logs: start them afresh
            (self.path / name).unlink(missing_ok=True)
        for name in (sharded.FOLDER, sharded.OLD):  # --overwrite: an FSDP run's shards go too
            shutil.rmtree(self.path / name, ignore_errors=True)

    def release(self, ok=True):
        """Let go of the out_dir. A run that failed before saving any checkpoint takes
        its config.json and metrics.jsonl with it, and the folder if it made it."""
        try:
            if not ok and not any((self.path / name).exists() for name in ("ckpt.pt", "best.pt", sharded.FOLDER, sharded.OLD)):
                for name in self.RUN_FILES:
                    (self.path / name).unlink(missing_ok=True)
        finally:
            self.lock.release()
        if self.created and [p.name for p in self.path.iterdir()] == [LOCK_NAME]:
            (self.path / LOCK_NAME).unlink(missing_ok=True)
            self.path.rmdir()
