"""Sharding the model with FSDP2, and activation checkpointing per block.

    torchrun --standalone --nproc_per_node=8 train.py configs/gpt2_xl.py --parallel=fsdp
    python train.py configs/shakespeare.py --activation_checkpointing=true

DDP keeps a whole copy of the weights, gradients and AdamW's two moments on
every rank (16 bytes a parameter in fp32). FSDP2 (`fully_shard`, PyTorch's
per-parameter sharding) turns every parameter into a DTensor split along its
first dimension across the ranks, so each rank keeps 1/W of that state. Before
a block runs forward (and again in backward) its parameters are all-gathered,
and after backward its gradients are reduce-scattered, each rank keeping the
gradient of its own shard. We shard each Transformer block as one unit (one
all-gather per block), then the root (embeddings, final norm, head: the tied
wte/lm_head weight must live in one unit).

`fully_shard` changes the model in place: the same `raw_model` object is then
an FSDP module whose parameters are DTensors, so the optimizers must be made
after sharding, and clipping and the optimizer steps act on local shards.

Activation checkpointing keeps only each block's input in forward and runs
the block again in backward (torch.utils.checkpoint): roughly one more
forward pass of compute for the activations inside the blocks. We replace
each block's `forward` rather than wrapping the module, so parameter names
(and so checkpoints and the Muon/AdamW split) do not change.
"""

import functools

import torch
from torch.utils.checkpoint import checkpoint

from gptkit.ops.errors import UserError
from gptkit.models.shapes import blocks


def check_settings(parallel, enabled, ptdtype):
    """Refuse impossible combinations before any work."""
    if parallel != "fsdp":
        return
    if not enabled:
        raise UserError(
            "parallel=fsdp shards the model across the ranks of a torchrun job: launch it with "
            "torchrun --standalone --nproc_per_node=N train.py ... (N=1 works), or use --parallel=ddp"
        )
    if ptdtype == torch.float16:
        # float16 needs a GradScaler whose unscale/inf checks would have to agree across
        # shards; bfloat16 has float32's range and needs none.
        raise UserError(
            "parallel=fsdp trains in bfloat16 or float32, not float16 (which dtype=auto picks on GPUs without "
            "native bfloat16, compute capability below 8.0): use --dtype=float32 there, --dtype=bfloat16 on newer GPUs"
        )


def shard(model, compute_dtype):
    """Apply FSDP2 in place: each block, then the whole model (root)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    # Parameters are gathered in the compute dtype (bf16 on GPUs: half the all-gather
    # traffic and memory of the gathered block) while the sharded master weights,
    # AdamW's moments and the gradient reduce-scatter stay float32 (summing many
    # ranks' bf16 gradients would lose precision). float32 on CPUs: no casts at all.
    policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for block in blocks(model)[1]:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def checkpoint_blocks(model):
    """Recompute every block's activations in backward instead of keeping them."""
    for block in blocks(model)[1]:
        # use_reentrant=False is torch's recommended mode (works with FSDP2 and keyword
        # arguments); the RNG state is saved, so dropout draws the same masks again.
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
    return model


def full_weights(model):
    """The whole (unsharded) state dict on CPU, gathered on every rank (a collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
