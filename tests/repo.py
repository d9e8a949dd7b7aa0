"""The repository root, for tests that run its scripts or read its files, and where
the offline copies the tests read are: $TINYSHAKESPEARE and $TIKTOKEN_CACHE_DIR, else
the CI machine's copies in a `shared/data` folder beside the repository."""

import os
import signal
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"
# Relative paths (what users write) are taken from where pytest starts: tests change directory.
SHAKESPEARE = Path(os.environ.get("TINYSHAKESPEARE") or SHARED_DATA / "tinyshakespeare" / "input.txt").absolute()
TIKTOKEN_CACHE = SHARED_DATA / "tiktoken"


def reset_sigint():
    """preexec_fn for a script a test will Ctrl-C: SIGINT's default disposition, whatever
    pytest inherited (started with `&` or by a launcher, it may ignore SIGINT)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
