"""The repository root, for tests that run its scripts or read its files."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
