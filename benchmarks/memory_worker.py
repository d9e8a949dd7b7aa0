"""One rank of the memory benchmark (run by bench_memory.py under torchrun).

    torchrun --standalone --nproc_per_node=2 benchmarks/memory_worker.py ddp 0 OUT.json

Builds the benchmark GPT, wraps it as train.py does (DDP, or FSDP2 with
gptkit.train.fsdp), optionally with activation checkpointing, takes a few AdamW
steps on random tokens and writes this rank's figures as JSON: the bytes of
parameters, gradients and optimizer state it holds (local shards under FSDP),
and the peak resident memory during the steps.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPE = dict(n_layer=8, n_head=8, n_embd=512, block_size=256, vocab_size=8192, dropout=0.0, bias=False)
BATCH, STEPS = 4, 3


def local_bytes(t):
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.numel() * t.element_size()


def rss_mb(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main(parallel, ac, out):
    from types import SimpleNamespace

    from gptkit.train import fsdp, optim
    from gptkit.train.distributed import Dist, broadcast_params
    from model import GPT, GPTConfig

    torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank()
    dist = Dist(rank=rank, world_size=torch.distributed.get_world_size(), enabled=True)
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SHAPE))
    if ac:
        fsdp.checkpoint_blocks(model)
    if parallel == "fsdp":
        broadcast_params(model, dist)
        fsdp.shard(model, torch.float32)
        module = model
    else:
        module = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
    cfg = SimpleNamespace(optimizer="adamw", weight_decay=0.1, learning_rate=1e-4, beta1=0.9, beta2=0.95)
    optimizers = optim.make_optimizers(model, cfg, "cpu")
    x = torch.randint(0, SHAPE["vocab_size"], (BATCH, SHAPE["block_size"]))
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to the current RSS
    before = rss_mb("VmRSS")
    for _ in range(STEPS):
        _, loss = module(x, x)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), 1.0)
        grads = sum(local_bytes(p.grad) for p in model.parameters() if p.grad is not None)
        optimizers[0].step()
        optimizers[0].zero_grad(set_to_none=True)
    peak = rss_mb("VmHWM")
    state = sum(local_bytes(t) for s in optimizers[0].state.values() for t in s.values() if torch.is_tensor(t))
    params = sum(local_bytes(p) for p in model.parameters())
    Path(f"{out}.{rank}").write_text(json.dumps({
        "rank": rank, "n_params": model.num_params(), "params_mb": params / 2**20, "grads_mb": grads / 2**20,
        "optimizer_mb": state / 2**20, "rss_before_mb": before, "peak_rss_mb": peak,
    }))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] == "1", sys.argv[3])
