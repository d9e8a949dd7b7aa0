"""Which device and number format a command runs on: `auto` picks the best one present."""

import torch

from gptkit.errors import UserError, same_on_every_rank

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def mps_available():
    return getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()


def resolve_device(name, local_rank=None):
    """'auto' -> the best device present (CUDA, then MPS, then the CPU); an explicit
    device must exist. Under torchrun each process takes the GPU of its local rank."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "mps" if mps_available() else "cpu"
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise same_on_every_rank(UserError(f"unknown device {name!r}: use auto, cpu, cuda, cuda:N or mps"))
    if device.type not in ("cpu", "cuda", "mps"):
        raise same_on_every_rank(UserError(f"device={name!r}: expected auto, cpu, cuda, cuda:N or mps"))
    # Under torchrun every rank finds the same: rank 0 alone prints it.
    if device.type == "cuda" and not torch.cuda.is_available():
        raise same_on_every_rank(UserError(f"device={name!r} but this PyTorch sees no CUDA GPU: use --device=cpu (or auto)"))
    if device.type == "mps" and not mps_available():
        raise same_on_every_rank(UserError(f"device={name!r} but MPS is not available here: use --device=cpu (or auto)"))
    if device.type == "cuda" and local_rank is not None:
        device = torch.device("cuda", local_rank)  # one process per device under torchrun
    return device


def training_dtype(name, device_type):
    """'auto' trains in bfloat16 on GPUs that have it (else float16 with a GradScaler),
    float32 elsewhere."""
    if name != "auto":
        return DTYPES[name]
    if device_type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def inference_dtype(name, device):
    """The dtype the weights are cast to for generating. It needs no fp32 master copy,
    and one token at a time reads every weight once per step: half the bytes
    (bfloat16) is up to twice the speed where memory bandwidth is the limit."""
    if name == "auto":
        bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        name = "bfloat16" if bf16 else "float32"
    return DTYPES[name]
