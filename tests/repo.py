"""The repository root, for tests that run its scripts or read its files."""

import signal
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def reset_sigint():
    """preexec_fn for a script a test will Ctrl-C: SIGINT's default disposition, whatever
    pytest inherited (started with `&` or by a launcher, it may ignore SIGINT)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
