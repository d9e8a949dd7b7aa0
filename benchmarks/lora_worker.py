"""One case of the LoRA benchmark (run by bench_lora.py, a fresh process per case).

    python benchmarks/lora_worker.py 124M full cpu 256 1 3 OUT.json
    python benchmarks/lora_worker.py 355M lora8 cpu 256 1 3 OUT.json

Builds a GPT-2-shaped model with random weights, applies LoRA (rank 8 on
attn.c_attn, scale 1) or not, takes STEPS AdamW steps on random tokens the way
train.py does (forward, backward, clip, step, zero_grad) and writes JSON: the
bytes of trainable parameters, gradients and AdamW state, ms per step (the first
step, which allocates, left out), and the process's peak memory: resident set
(ru_maxrss, the whole life of the process) on a CPU, the CUDA allocator's peak
on a GPU.
"""

import json
import resource
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = {  # GPT-2 small and medium (Radford et al. 2019, table 2)
    "124M": dict(n_layer=12, n_head=12, n_embd=768),
    "355M": dict(n_layer=24, n_head=16, n_embd=1024),
    "1.5B": dict(n_layer=48, n_head=25, n_embd=1600),
}


def tensor_mb(tensors):
    return sum(t.numel() * t.element_size() for t in tensors) / 2**20


def main(shape, mode, device, block_size, batch_size, steps, out):
    from gptkit.models import lora
    from gptkit.train import optim
    from gptkit.train.step import clip_gradients
    from model import GPT, GPTConfig

    torch.manual_seed(0)
    with torch.device(device):
        model = GPT(GPTConfig(**SHAPES[shape], block_size=block_size, vocab_size=50257, dropout=0.0))
    if mode.startswith("lora"):
        lora.apply(model, rank=int(mode.removeprefix("lora")), alpha=float(mode.removeprefix("lora")),
                   dropout=0.0, targets=("attn.c_attn",))
    cfg = SimpleNamespace(optimizer="adamw", weight_decay=0.1, learning_rate=1e-4, beta1=0.9, beta2=0.95)
    [adamw] = optim.make_optimizers(model, cfg, device.split(":")[0])
    x = torch.randint(0, 50257, (batch_size, block_size), device=device)
    times, grads_mb = [], 0.0
    for _ in range(steps):
        start = time.perf_counter()
        _, loss = model(x, x)
        loss.backward()
        clip_gradients(model, 1.0)
        grads_mb = tensor_mb(p.grad for p in model.parameters() if p.grad is not None)
        adamw.step()
        adamw.zero_grad(set_to_none=True)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    trainable = [p for p in model.parameters() if p.requires_grad]
    state = [t for s in adamw.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0]
    if device.startswith("cuda"):
        peak_mb = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux
    Path(out).write_text(json.dumps({
        "params": sum(p.numel() for p in model.parameters()), "trainable": sum(p.numel() for p in trainable),
        "params_mb": tensor_mb(model.parameters()), "grads_mb": grads_mb, "adamw_mb": tensor_mb(state),
        "ms_per_step": 1000 * statistics.median(times[1:] or times), "peak_mb": peak_mb,
    }))


if __name__ == "__main__":
    shape, mode, device, block_size, batch_size, steps, out = sys.argv[1:]
    main(shape, mode, device, int(block_size), int(batch_size), int(steps), out)
