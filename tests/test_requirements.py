"""requirements.txt's torch floor is the oldest release the code runs on: the newest
release any unguarded call below needs. A call newer than the floor must sit behind
a version check. The list must name calls the code still makes (a stale entry fails)."""

import re

import torch
from torch.torch_version import TorchVersion

from repo import REPO

# (text in the code, the file it is in, the torch release that first has it, guarded by a version check)
VERSION_GATED = [
    ("enable_gqa=", "model.py", "2.5", False),  # F.scaled_dot_product_attention's grouped-query heads
    ("torch.OutOfMemoryError", "train.py", "2.5", False),  # the device-generic OOM error
    ("from torch.distributed.tensor import", "gptkit/train/muon.py", "2.5", False),  # DTensor public (was _tensor)
    ("get_total_norm(", "gptkit/train/step.py", "2.6", False),  # torch.nn.utils.get_total_norm
    ("from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard", "gptkit/train/fsdp.py", "2.6", False),  # FSDP2 public
    ("src_data_rank=None", "gptkit/train/muon.py", "2.7", False),  # distribute_tensor without a broadcast
    ("fp32_precision", "gptkit/ops/device.py", "2.9", True),  # the TF32 API that replaced allow_tf32
]


def torch_floor():
    for line in (REPO / "requirements.txt").read_text().splitlines():
        match = re.match(r"torch>=([\d.]+)", line.strip())
        if match:
            return match.group(1)
    raise AssertionError("requirements.txt has no torch>= line")


def test_every_listed_call_is_still_in_the_code():
    for text, path, _, _ in VERSION_GATED:
        assert text in (REPO / path).read_text(), f"{path} no longer has {text!r}: update VERSION_GATED"


def test_the_floor_is_the_newest_release_an_unguarded_call_needs():
    needed = max((TorchVersion(v) for _, _, v, guarded in VERSION_GATED if not guarded))
    assert TorchVersion(torch_floor()) == needed, (
        f"requirements.txt says torch>={torch_floor()}, the code needs {needed}: "
        + ", ".join(f"{t} ({v})" for t, _, v, g in VERSION_GATED if not g and TorchVersion(v) > TorchVersion(torch_floor())))


def test_calls_newer_than_the_floor_are_behind_a_version_check():
    for text, path, version, guarded in VERSION_GATED:
        if TorchVersion(version) > TorchVersion(torch_floor()):
            assert guarded and f'TorchVersion(torch.__version__) >= "{version}"' in (REPO / path).read_text(), (
                f"{text!r} needs torch {version} > the floor {torch_floor()}: guard it in {path}")


def test_the_installed_torch_meets_the_floor():
    assert TorchVersion(torch.__version__) >= torch_floor()
