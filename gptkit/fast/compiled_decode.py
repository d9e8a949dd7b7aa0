"""Compiled decoding, gpt-fast's way: a static KV cache and one compiled step per token.

    python sample.py --compile --temperature 0 --max_new_tokens 200

torch.compile specialises on the Python ints it sees and compiles again when one
changes. Compiling each block on its own, with the cache's length and the layer
number as ints, compiles again for every layer and every token until the
recompile limit, and from then on runs eager. gpt-fast
(github.com/pytorch-labs/gpt-fast, generate.py and model.py) avoids that, and so
does this file:

- the cache is allocated once for block_size positions (StaticKVCache): no shape
  changes from token to token; the positions not written yet are masked out;
- the position is a 0-d tensor (cache.length), never a Python int, so no guard
  depends on it;
- one function, the whole model on one token (GPT.next_token_logits), is compiled
  once, with fullgraph=True: a graph break would be an error, not a slowdown;
- the prompt, whose length changes from run to run, runs separately and eagerly.

On CUDA this is what makes small-batch decoding fast: a one-token step is a few
hundred tiny kernels, and launching them is most of its time. On a CPU it did not
pay for its compile time when measured (BENCHMARKS.md; sample.py --help says so).
"""

import sys

import torch

from gptkit.ops.errors import first_line


class StaticKVCache:
    """model.py's KVCache with every tensor allocated once: keys and values
    (B, Hkv, max_length, D) for each layer, and the length as a 0-d tensor that the
    model advances in place. update() writes by index at positions length..;
    attention_mask() hides the positions not written yet."""

    def __init__(self, model, batch_size, max_length):
        c = model.config
        assert max_length <= c.block_size, f"a cache of {max_length} positions exceeds block_size={c.block_size}"
        weight = next(model.parameters())  # the dtype and device the model's keys and values come in
        shape = (batch_size, c.kv_heads, max_length, c.head_dim)
        self.k = [weight.new_zeros(shape) for _ in range(c.n_layer)]
        self.v = [weight.new_zeros(shape) for _ in range(c.n_layer)]
        self.max_length = max_length
        self.length = torch.zeros((), dtype=torch.long, device=weight.device)

    def update(self, layer, k, v):
        """Write k, v (B, Hkv, T, D) at the next T positions; return all max_length of them."""
        positions = self.length + torch.arange(k.size(2), device=k.device)  # (T,)
        self.k[layer].index_copy_(2, positions, k)
        self.v[layer].index_copy_(2, positions, v)
        return self.k[layer], self.v[layer]  # (B, Hkv, max_length, D)

    def attention_mask(self, T, device):
        """(T, max_length) bool: each of the T new tokens sees the positions up to its own."""
        query = self.length + torch.arange(T, device=device)  # (T,)
        return torch.arange(self.max_length, device=device) <= query[:, None]


class CompiledDecoder:
    """What generate_stream runs the model with under sample.py --compile:
    `new_cache()` gives a StaticKVCache of block_size positions, and
    `decoder(idx, cache)` gives the logits after idx (B, T): one token through the
    compiled function, a prompt (or a shifted window) eagerly. If compiling fails, a
    warning names the error and decoding goes on eagerly."""

    def __init__(self, model, batch_size):
        self.model, self.batch_size = model, batch_size
        self.compiled = torch.compile(model.next_token_logits, fullgraph=True, dynamic=False)

    def new_cache(self):
        return StaticKVCache(self.model, self.batch_size, self.model.config.block_size)

    def __call__(self, idx, cache):
        if idx.size(1) == 1 and self.compiled is not None:
            # A fresh (B, 1) tensor: a column of generate_stream's token buffer has its row
            # stride, which changes with max_new_tokens, and torch.compile guards on strides.
            token = idx.new_empty(idx.shape).copy_(idx)
            try:
                return self.compiled(token, cache)
            except torch.OutOfMemoryError:
                raise  # not a compile failure: eager would run out of memory too
            except Exception as e:
                print(f"warning: torch.compile failed ({type(e).__name__}: {first_line(e)}); decoding without compile",
                      file=sys.stderr)
                self.compiled = None
        return self.model.next_token_logits(idx, cache)
