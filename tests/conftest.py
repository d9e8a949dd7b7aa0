"""Shared test set-up: offline data (TINYSHAKESPEARE, TIKTOKEN_CACHE_DIR, else CI's copy beside
the repository), markers, tiny helpers."""

import os
import signal
import tempfile

import pytest
import torch
from repo import SHAKESPEARE, TIKTOKEN_CACHE

# Tiny test models are dominated by per-op overhead, and torch's thread pool makes
# them many times slower when the cores are shared (subprocess training, DDP ranks).
torch.set_num_threads(1)

# The measured CPU matmul peak is cached per machine (gptkit/train/mfu.py): never in the
# user's home from a test run, and shared by the subprocesses tests start.
os.environ.setdefault("GPTKIT_CACHE_DIR", tempfile.mkdtemp(prefix="gptkit-test-cache-"))

# Point tiktoken at the offline GPT-2 BPE files before anything imports it.
if "TIKTOKEN_CACHE_DIR" not in os.environ and TIKTOKEN_CACHE.is_dir():
    os.environ["TIKTOKEN_CACHE_DIR"] = str(TIKTOKEN_CACHE)
for name in ("TINYSHAKESPEARE", "TIKTOKEN_CACHE_DIR"):
    if os.environ.get(name):
        os.environ[name] = os.path.abspath(os.environ[name])


def _gpt2_bpe_available():
    try:
        import tiktoken

        tiktoken.get_encoding("gpt2")
        return True
    except Exception:
        return False


@pytest.fixture
def shakespeare_path():
    if not SHAKESPEARE.is_file():
        pytest.skip(f"Tiny Shakespeare not found at {SHAKESPEARE} (set TINYSHAKESPEARE=path)")
    return SHAKESPEARE


@pytest.fixture
def default_sigint():
    """Ctrl-C raises KeyboardInterrupt during the test, however pytest was started
    (SIGINT ignored when it was started with `&`); the handler is put back after."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield previous
    signal.signal(signal.SIGINT, previous)


@pytest.fixture
def tiktoken_available():
    if not _gpt2_bpe_available():
        pytest.skip("GPT-2 BPE files not available offline (set TIKTOKEN_CACHE_DIR)")
    return True


def pytest_configure(config):
    if os.environ.get("GPTKIT_GPU_CHECK") and not torch.cuda.is_available():
        # set by scripts/gpu_check.sh, where skipped GPU tests would read as passed
        raise pytest.UsageError("GPTKIT_GPU_CHECK is set but torch sees no CUDA device: the GPU tests cannot run here")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA (run scripts/gpu_check.sh on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
