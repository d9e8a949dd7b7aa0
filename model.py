"""The GPT: a decoder-only Transformer, with the variants the Transformer chapter teaches.

Defaults are GPT-2 small (Radford et al. 2019) with GPT-2's parameter names, so the
pretrained weights load name by name (gptkit/interop/hf_gpt2.py). Each variant is one
GPTConfig field, read in exactly one place:

    pos_encoding   learned | sinusoidal | rope | none   (GPT._embed; rope: CausalSelfAttention.qkv)
    norm           layernorm | rmsnorm                   (make_norm)
    norm_placement pre | post                            (Block.forward)
    mlp            gelu | gelu_exact | relu2 | swiglu    (MLP.__init__)
    attention      sdpa | reference | matmul             (CausalSelfAttention.forward)

One forward pass, for token ids idx of shape (B, T):
    x = wte[idx] (+ position information)          # (B, T, C)
    for each block: x = x + attn(norm(x)); x = x + mlp(norm(x))
    logits = lm_head(norm(x))                      # (B, T, vocab_size)

Generating text: `GPT.generate` is nanoGPT's loop (crop, forward, sample), with no
cache. A KVCache keeps the keys and values of past tokens so that
`next_token_logits(new_tokens, cache)` runs the model on the new tokens only;
gptkit/generation/generate.py builds sample.py's generation on it (cache policies past
block_size, top_p, min_p, repetition penalty, stop tokens). A BatchKVCache holds rows of
different lengths, each at its own positions (serve.py's continuous batching).

    python -c "import model; print(model.GPT(model.GPTConfig(n_layer=2, n_embd=64)))"
    python lab.py params configs/gpt2.py    # where the 124M parameters are
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptkit.config import choice_problems, setting

CHOICES = {
    "pos_encoding": ("learned", "sinusoidal", "rope", "none"),
    "norm": ("layernorm", "rmsnorm"),
    "norm_placement": ("pre", "post"),
    "mlp": ("gelu", "gelu_exact", "relu2", "swiglu"),
    "attention": ("sdpa", "reference", "matmul"),
}
NORM_EPS = 1e-5  # GPT-2's layer_norm_epsilon and LLaMA-2's rms_norm_eps


@dataclass
class GPTConfig:
    """Model shape and architecture"""

    block_size: int = setting(1024, "longest context the model sees, in tokens")
    vocab_size: int = setting(50257, "number of token ids (GPT-2 BPE: 50257)")
    n_layer: int = setting(12, "number of Transformer blocks")
    n_head: int = setting(12, "attention heads per block")
    n_embd: int = setting(768, "width of the residual stream")
    dropout: float = setting(0.0, "dropout probability (0 for pretraining, ~0.1-0.2 when "
                                  "finetuning)")
    attn_dropout: bool = setting(True, "dropout on the attention weights too, as GPT-2 (False: "
                                       "on the residual branches only; on a CPU the fused "
                                       "attention kernel then still runs)")
    bias: bool = setting(True, "biases in Linear layers and norms, as GPT-2 (False is slightly "
                               "faster)")
    pos_encoding: str = setting("learned", "position information: learned | sinusoidal | rope | "
                                           "none")
    rope_theta: float = setting(10000.0, "RoPE base: rotation angles are position * "
                                         "rope_theta^(-2i/head_dim)")
    norm: str = setting("layernorm", "normalization: layernorm | rmsnorm")
    norm_placement: str = setting("pre", "pre (GPT-2 and later) or post (the original Transformer)")
    mlp: str = setting("gelu", "MLP: gelu (GPT-2's tanh form) | gelu_exact (erf, nanoGPT) | relu2 "
                               "| swiglu")
    mlp_hidden: int | None = setting(None, "MLP hidden size; none = 4*n_embd, or for swiglu the "
                                           "size matching its parameters")
    qk_norm: bool = setting(False, "RMS-normalize queries and keys per head before attention")
    n_kv_head: int | None = setting(None, "key/value heads (none = n_head; fewer = grouped-query, "
                                          "1 = multi-query)")
    tie_embeddings: bool = setting(True, "share the token embedding with the output layer "
                                         "(lm_head), as GPT-2")
    logit_softcap: float | None = setting(None, "squash logits to (-cap, cap) with "
                                                "cap*tanh(logits/cap); none = off")
    pad_vocab_multiple: int = setting(1, "pad the embedding table to a multiple of this (64 is "
                                         "faster on GPUs)")
    zero_init_proj: bool = setting(False, "start every output projection c_proj at zero "
                                          "(modded-nanogpt)")
    attention: str = setting("sdpa", "sdpa (PyTorch's flash/memory-efficient kernels) | "
                                     "reference (the formula written out, slow) | matmul (the "
                                     "formula in two batched products: on a CPU in bfloat16 the "
                                     "fastest to train at small head sizes)")

    def __post_init__(self):
        problems = []
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd",
                     "pad_vocab_multiple"):
            if getattr(self, name) < 1:
                problems.append(f"{name}={getattr(self, name)} must be at least 1")
        problems += choice_problems(self, CHOICES)
        if self.n_head >= 1 and self.n_embd % self.n_head:
            problems.append(
                f"n_embd={self.n_embd} must be divisible by n_head={self.n_head} (each head gets "
                f"n_embd/n_head dims)"
            )
        kv = self.n_kv_head
        if kv is not None and not (1 <= kv <= self.n_head and self.n_head % kv == 0):
            problems.append(
                f"n_head={self.n_head} must be a multiple of n_kv_head={self.n_kv_head} "
                "(each key/value head serves the same number of query heads)"
            )
        if self.pos_encoding == "rope" and self.n_head >= 1 and (self.n_embd // self.n_head) % 2:
            problems.append(
                f"pos_encoding='rope' needs an even head size, but n_embd/n_head = "
                f"{self.n_embd}/{self.n_head} "
                f"= {self.n_embd // self.n_head} (RoPE rotates pairs of dimensions)"
            )
        if self.pos_encoding == "sinusoidal" and self.n_embd % 2:
            problems.append(f"pos_encoding='sinusoidal' needs an even n_embd (sine/cosine pairs), "
                            f"got n_embd={self.n_embd}")
        if not 0 <= self.dropout < 1:
            problems.append(f"dropout={self.dropout} must be in [0, 1)")
        if self.rope_theta <= 0:
            problems.append(f"rope_theta={self.rope_theta} must be positive")
        if self.mlp_hidden is not None and self.mlp_hidden < 1:
            problems.append(f"mlp_hidden={self.mlp_hidden} must be at least 1 (or none)")
        if self.logit_softcap is not None and self.logit_softcap <= 0:
            problems.append(f"logit_softcap={self.logit_softcap} must be positive (or none)")
        if problems:
            raise ValueError("invalid model settings: " + "; ".join(problems))

    @property
    def head_dim(self):
        return self.n_embd // self.n_head

    @property
    def kv_heads(self):
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def hidden_size(self):
        """The MLP's hidden width. SwiGLU has three matrices instead of two, so 8d/3
        (rounded up to a multiple of 8) keeps its parameters equal to the 4d GELU MLP's
        (Shazeer 2020, "GLU Variants Improve Transformer")."""
        if self.mlp_hidden is not None:
            return self.mlp_hidden
        if self.mlp == "swiglu":
            return 8 * math.ceil(8 * self.n_embd / 3 / 8)
        return 4 * self.n_embd

    @property
    def padded_vocab_size(self):
        m = self.pad_vocab_multiple
        return (self.vocab_size + m - 1) // m * m


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight (+ bias): LayerNorm without the centering
    (Zhang & Sennrich 2019)."""

    def __init__(self, dim, bias=False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x):
        # the weight in x's dtype: under bfloat16 autocast on a CPU, x can be bfloat16 while
        # the weight stays float32, which PyTorch's one-pass kernel refuses (it warns and
        # runs a slower chain of operations)
        y = F.rms_norm(x, (x.size(-1),), self.weight.to(x.dtype), NORM_EPS)
        return y if self.bias is None else y + self.bias


def make_norm(config):
    if config.norm == "rmsnorm":
        return RMSNorm(config.n_embd, bias=config.bias)
    return nn.LayerNorm(config.n_embd, eps=NORM_EPS, bias=config.bias)


def sinusoidal_table(n_positions, dim):
    """The original Transformer's positions (Vaswani et al. 2017, section 3.5):
    PE[pos, 2i] = sin(pos / 10000^(2i/dim)), PE[pos, 2i+1] = cos(the same angle)."""
    pos = torch.arange(n_positions, dtype=torch.float32)[:, None]  # (T, 1)
    inv_freq = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float32) / dim)  # (C/2,)
    table = torch.zeros(n_positions, dim)
    table[:, 0::2] = torch.sin(pos * inv_freq)
    table[:, 1::2] = torch.cos(pos * inv_freq)
    return table  # (T, C)


def rope_angles(n_positions, head_dim, theta=10000.0, dtype=torch.float32):
    """cos and sin of the RoPE angle m * theta^(-2i/D) for position m and pair i
    (Su et al. 2021, "RoFormer", eq. 15). Each is (T, D/2)."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=dtype) / head_dim)  # (D/2,)
    angles = torch.arange(n_positions, dtype=dtype)[:, None] * inv_freq  # (T, D/2)
    return torch.cos(angles), torch.sin(angles)


def apply_rope(x, cos, sin):
    """Rotate each pair (x[i], x[i + D/2]) of x (..., T, D) by its angle; cos, sin (T, D/2).
    Pairing the two halves (as GPT-NeoX and LLaMA do) instead of neighbours is the same
    rotation on a permuted basis. Computed in fp32 at least, returned in x's dtype."""
    # (..., T, D/2) each
    x1, x2 = x.to(torch.promote_types(x.dtype, torch.float32)).chunk(2, dim=-1)
    rotated = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return rotated.type_as(x)


def reference_attention(q, k, v, causal=True, return_stages=False, dropout_p=0.0, mask=None):
    """softmax(Q Kᵀ / √d_k + causal mask) V, written the way the formula reads.

    q (B, H, Tq, D); k, v (B, Hkv, Tk, D) with H a multiple of Hkv (grouped-query
    attention: query head h uses key/value head h // (H/Hkv)). With causal=True,
    query i sits at position Tk - Tq + i and sees keys up to that position; a bool
    mask (Tq, Tk), or (B, 1, Tq, Tk) with one per row, True where a query sees a key,
    replaces that rule. Dividing
    by √d_k keeps the scores' variance near 1 so softmax does not saturate
    (Vaswani et al. 2017, section 3.2.1).
    """
    if k.size(1) != q.size(1):
        k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)  # (B, H, Tk, D)
        v = v.repeat_interleave(q.size(1) // v.size(1), dim=1)
    Tq, Tk = q.size(-2), k.size(-2)
    scores = q @ k.transpose(-2, -1)  # (B, H, Tq, Tk)
    scaled = scores / math.sqrt(q.size(-1))
    if mask is not None:
        scaled = scaled.masked_fill(~mask, float("-inf"))
    elif causal:
        query_pos = torch.arange(Tk - Tq, Tk, device=q.device)[:, None]  # (Tq, 1)
        future = torch.arange(Tk, device=q.device)[None, :] > query_pos  # (Tq, Tk)
        scaled = scaled.masked_fill(future, float("-inf"))
    weights = torch.softmax(scaled, dim=-1)  # each row sums to 1
    out = F.dropout(weights, dropout_p) @ v if dropout_p > 0 else weights @ v  # (B, H, Tq, D)
    if return_stages:
        return out, {"scores": scores, "scaled": scaled, "weights": weights, "output": out}
    return out


def matmul_attention(q, k, v, mask=None, dropout_p=0.0):
    """reference_attention's result in two batched matrix products, the scale and the
    mask folded into the first: torch.baddbmm(bias, Q, Kᵀ, alpha=1/√d_k) is
    Q Kᵀ / √d_k + bias in one pass, bias being 0 where a query sees a key and -inf
    elsewhere. Shapes and `mask` as reference_attention's (mask None: causal). Fewer
    passes over the (Tq, Tk) scores than the formula written out and no fused kernel:
    on a CPU in bfloat16 the fastest way found to train at head sizes of 32
    (benchmarks/LOG.md, 2026-12-07; in float32 SDPA is faster there)."""
    if k.size(1) != q.size(1):  # grouped-query attention, as reference_attention
        k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)
        v = v.repeat_interleave(q.size(1) // v.size(1), dim=1)
    B, H, Tq, D = q.shape
    Tk = k.size(-2)
    if mask is None:  # query i at position Tk - Tq + i sees keys up to it
        query_pos = torch.arange(Tk - Tq, Tk, device=q.device)[:, None]  # (Tq, 1)
        mask = torch.arange(Tk, device=q.device)[None, :] <= query_pos  # (Tq, Tk)
    bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device)
    bias = bias.masked_fill_(~mask, float("-inf"))  # 0 where a query sees a key, -inf elsewhere
    if bias.dim() == 2:  # one (Tq, Tk) for every row and head: a view, not B*H copies
        bias = bias.expand(B * H, Tq, Tk)
    else:  # (B, 1, Tq, Tk): one per row
        bias = bias.expand(B, H, Tq, Tk).reshape(B * H, Tq, Tk)
    q, k, v = q.reshape(B * H, Tq, D), k.reshape(B * H, Tk, D), v.reshape(B * H, Tk, D)
    scores = torch.baddbmm(bias, q, k.transpose(1, 2), alpha=1 / math.sqrt(D))  # (B*H, Tq, Tk)
    weights = torch.softmax(scores, dim=-1)
    out = F.dropout(weights, dropout_p) @ v if dropout_p > 0 else weights @ v  # (B*H, Tq, D)
    return out.view(B, H, Tq, D)


class KVCache:
    """Keys and values of every layer for the tokens seen so far, in tensors allocated
    once for block_size positions (no concatenation per token)."""

    def __init__(self, n_layer, max_length):
        self.k = [None] * n_layer
        self.v = [None] * n_layer
        self.max_length = max_length
        self.length = 0  # tokens stored; the next token's position

    def update(self, layer, k, v):
        """Store k, v (B, Hkv, T, D) after the cached ones; return all keys and values so far."""
        start, end = self.length, self.length + k.size(2)
        assert end <= self.max_length, f"cache holds {self.max_length} positions, asked for {end}"
        if self.k[layer] is None:  # allocated on first use, in the dtype autocast gives k
            B, Hkv, _, D = k.shape
            self.k[layer] = k.new_empty(B, Hkv, self.max_length, D)
            self.v[layer] = v.new_empty(B, Hkv, self.max_length, D)
        self.k[layer][:, :, start:end] = k
        self.v[layer][:, :, start:end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]  # (B, Hkv, end, D)

    def attention_mask(self, T, device):
        """Which keys T new tokens see, (T, length + T) bool, or None where SDPA's own
        rules say it: is_causal aligns its mask top-left, right only when queries and
        keys start together (an empty cache); one new token sees every cached key. A
        chunk after cached tokens needs the mask."""
        end = self.length + T
        if 1 < T < end:
            return torch.ones(T, end, dtype=torch.bool, device=device).tril(end - T)
        return None


class BatchKVCache(KVCache):
    """A KVCache whose B rows are separate sequences of different lengths, for a server
    that batches requests as they come and go (gptkit/serve/batch.py).

    Row b's token at position p sits in column p of row b, so each row has its own
    length, and the columns past it hold padding (another row's longer history, or
    nothing yet) that no query of row b may see:

        k[layer], v[layer]   (B, Hkv, max_length, D)
        length               (B, 1) long: each row's tokens stored, its next token's position

    `length` being a tensor is all the model needs: GPT._embed and
    CausalSelfAttention.qkv take positions start + t from it per row, and
    attention_mask hides every column at or past a row's next position + t."""

    GROW = 64  # columns are allocated as the longest row needs them, this many at a time

    def __init__(self, n_layer, max_length, batch_size, device=None):
        super().__init__(n_layer, max_length)
        self.length = torch.zeros(batch_size, 1, dtype=torch.long, device=device)

    @property
    def length(self):
        return self._length

    @length.setter
    def length(self, value):  # `cache.length += T` after the last layer too: the positions move on
        self._length, self.this_step = value, None

    def step_positions(self, T, device):
        """This step's (columns (B, T): each row's positions, end: the longest row's end,
        mask: attention_mask's), computed once for all the layers (length moves after the last)."""
        if self.this_step is None or self.this_step[0] != T:
            columns = self.length + torch.arange(T, device=device)
            low, high = self.length.aminmax()
            end = int(high) + T
            if T == 1 and int(low) == end - 1:  # one new token, rows of one length: all keys
                mask = None
            else:
                keys = torch.arange(end, device=device)
                mask = (keys[None, None, :] <= columns[:, :, None])[:, None]  # (B, 1, T, end)
            self.this_step = (T, columns, end, mask)
        return self.this_step[1:]

    def update(self, layer, k, v):
        """Write k, v (B, Hkv, T, D) at each row's own next T columns; return keys and
        values (B, Hkv, end, D) up to the longest row's end (the rest is never seen)."""
        B, Hkv, T, D = k.shape
        columns, end, _ = self.step_positions(T, k.device)
        assert end <= self.max_length, f"cache holds {self.max_length} positions, asked for {end}"
        if self.k[layer] is None or self.k[layer].size(2) < end:  # room for `end` columns
            width = min(self.max_length, -(-end // self.GROW) * self.GROW)
            self.k[layer] = widened(self.k[layer], k, width)
            self.v[layer] = widened(self.v[layer], v, width)
        index = columns[:, None, :, None].expand(B, Hkv, T, D)
        self.k[layer].scatter_(2, index, k)
        self.v[layer].scatter_(2, index, v)
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def attention_mask(self, T, device):
        """(B, 1, T, end) bool, True where row b's new token t (at position length[b] + t)
        sees a column: its own past and itself, never a later column (padding). None where
        one new token comes on rows of one length: it sees every column (SDPA's fast path)."""
        return self.step_positions(T, device)[2]

    def keep(self, rows):
        """Keep only `rows` (indices, in that order): the rows of finished requests leave."""
        index = torch.tensor(rows, dtype=torch.long, device=self.length.device)
        self.length = self.length[index]
        for store in (self.k, self.v):
            store[:] = [None if t is None else t[index] for t in store]

    def append(self, other):
        """Add the rows of `other`, a BatchKVCache (a new request's prompt, run alone),
        after these; the narrower of the two gets zero columns (padding) to match."""
        self.length = torch.cat((self.length, other.length))
        for mine, theirs in ((self.k, other.k), (self.v, other.v)):
            for layer, (a, b) in enumerate(zip(mine, theirs)):
                if a is None or a.size(0) == 0:
                    mine[layer] = b
                else:
                    width = max(a.size(2), b.size(2))
                    mine[layer] = torch.cat((widened(a, a, width), widened(b, b, width)))


def widened(t, like, width):
    """t (B, Hkv, columns, D) with zero columns added up to `width` (t None: zeros shaped
    as `like`)."""
    if t is None:
        B, Hkv, _, D = like.shape
        return like.new_zeros(B, Hkv, width, D)
    if t.size(2) >= width:
        return t
    return torch.cat((t, t.new_zeros(*t.shape[:2], width - t.size(2), t.size(3))), dim=2)


def rows(table, start, T):
    """table[start : start + T]. A compiled decoding step passes start as a 0-d tensor
    (gptkit/fast/compiled_decode.py), which torch.compile must not read as a Python int
    (it would recompile for every position): then the rows are gathered by index. A
    BatchKVCache's start is (B, 1), one position per row: the rows are then (B, T, ...)."""
    if isinstance(start, int):
        return table[start : start + T]
    return table[start + torch.arange(T, device=table.device)]


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention. c_attn computes q, k, v for all heads in one
    matrix: its output splits into [q | k | v] of widths n_head*D, n_kv_head*D,
    n_kv_head*D, each laid out head by head (`qkv` does the split)."""

    def __init__(self, config):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.kv_heads, config.head_dim
        qkv_width = (self.n_head + 2 * self.n_kv_head) * self.head_dim
        self.c_attn = nn.Linear(config.n_embd, qkv_width, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        if config.qk_norm:  # keeps attention logits bounded (Dehghani et al. 2023; OLMo 2)
            self.q_norm, self.k_norm = RMSNorm(self.head_dim), RMSNorm(self.head_dim)
        self.qk_norm = config.qk_norm
        self.rope = config.pos_encoding == "rope"
        if self.rope:
            cos, sin = rope_angles(config.block_size, self.head_dim, config.rope_theta)
            self.register_buffer("rope_cos", cos, persistent=False)  # (block_size, D/2)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.attention = config.attention
        self.dropout = config.dropout if config.attn_dropout else 0.0  # on the attention weights
        self.resid_dropout = nn.Dropout(config.dropout)

    def qkv(self, x, start=0):
        """q (B, H, T, D), k and v (B, Hkv, T, D) for x (B, T, C) whose first token sits at
        position `start`; after qk_norm and RoPE where configured."""
        B, T, _ = x.shape
        H, Hkv, D = self.n_head, self.n_kv_head, self.head_dim
        q, k, v = self.c_attn(x).split([H * D, Hkv * D, Hkv * D], dim=2)
        q = q.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, Hkv, D).transpose(1, 2)  # (B, Hkv, T, D)
        v = v.view(B, T, Hkv, D).transpose(1, 2)  # (B, Hkv, T, D)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope:
            cos, sin = rows(self.rope_cos, start, T), rows(self.rope_sin, start, T)
            if cos.dim() == 3:  # one position per row (BatchKVCache): (B, 1, T, D/2) for the heads
                cos, sin = cos[:, None], sin[:, None]
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return q, k, v

    def forward(self, x, cache=None, layer=0):
        B, T, C = x.shape
        start = cache.length if cache is not None else 0
        q, k, v = self.qkv(x, start)
        mask = None
        if cache is not None:
            mask = cache.attention_mask(T, x.device)  # (T, keys) or None
            k, v = cache.update(layer, k, v)  # (B, Hkv, keys, D)
        dropout_p = self.dropout if self.training else 0.0
        if self.attention == "reference":
            y = reference_attention(q, k, v, causal=True, dropout_p=dropout_p, mask=mask)
        elif self.attention == "matmul":
            y = matmul_attention(q, k, v, mask=mask, dropout_p=dropout_p)
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=(T > 1 and mask is None),
                enable_gqa=self.n_kv_head != self.n_head,
            )  # (B, H, T, D)
        y = y.transpose(1, 2).reshape(B, T, C)  # heads side by side again (a view when T == 1)
        return self.resid_dropout(self.c_proj(y))


class ReLU2(nn.Module):
    """relu(h)², the squared ReLU of Primer (So et al. 2021)."""

    def forward(self, h):
        return F.relu(h).square()


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        hidden = config.hidden_size
        self.gated = config.mlp == "swiglu"
        fc_width = 2 * hidden if self.gated else hidden  # swiglu: [gate | up] in one matrix
        self.c_fc = nn.Linear(config.n_embd, fc_width, bias=config.bias)
        if config.mlp == "gelu":  # GPT-2 uses GELU's tanh approximation ("gelu_new")
            self.act = nn.GELU(approximate="tanh")
        elif config.mlp == "gelu_exact":
            self.act = nn.GELU()  # the erf form, as nanoGPT's: its checkpoints load exactly
        elif config.mlp == "relu2":
            self.act = ReLU2()
        else:  # SwiGLU (Shazeer 2020): silu(gate) * up
            self.act = nn.SiLU()
        self.c_proj = nn.Linear(hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        h = self.c_fc(x)  # (B, T, fc_width)
        if self.gated:
            gate, up = h.chunk(2, dim=-1)  # (B, T, hidden) each
            h = self.act(gate) * up
        else:
            h = self.act(h)
        return self.dropout(self.c_proj(h))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.pre_norm = config.norm_placement == "pre"
        self.ln_1 = make_norm(config)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = make_norm(config)
        self.mlp = MLP(config)

    def forward(self, x, cache=None, layer=0):
        if self.pre_norm:  # GPT-2: normalize each sublayer's input, keep a clean residual path
            x = x + self.attn(self.ln_1(x), cache, layer)
            return x + self.mlp(self.ln_2(x))
        # original Transformer: normalize after adding (Vaswani et al. 2017, section 3.1)
        x = self.ln_1(x + self.attn(x, cache, layer))
        return self.ln_2(x + self.mlp(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        modules = dict(
            wte=nn.Embedding(config.padded_vocab_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList(Block(config) for _ in range(config.n_layer)),
            # post-norm blocks already end with a norm (the original Transformer has no final one)
            ln_f=make_norm(config) if config.norm_placement == "pre" else nn.Identity(),
        )
        if config.pos_encoding == "learned":
            modules["wpe"] = nn.Embedding(config.block_size, config.n_embd)
        self.transformer = nn.ModuleDict(modules)
        if config.pos_encoding == "sinusoidal":
            table = sinusoidal_table(config.block_size, config.n_embd)
            self.register_buffer("sinusoid", table, persistent=False)
        self.lm_head = nn.Linear(config.n_embd, config.padded_vocab_size, bias=False)
        if config.tie_embeddings:  # one matrix both reads and writes tokens (Press & Wolf 2017)
            self.transformer.wte.weight = self.lm_head.weight
        if not self.lm_head.weight.is_meta:  # shapes only (parameter counts): nothing to fill
            self.init_weights()

    def init_weights(self):
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                if self.config.zero_init_proj:
                    nn.init.zeros_(p)
                else:  # GPT-2 section 2.3: scale residual layers by 1/sqrt(N), N = 2 per block
                    nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * self.config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):  # GPT-2's N(0, 0.02)
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self, non_embedding=False):
        """Parameter count; non_embedding=True leaves out the token and position
        embeddings and the output layer, which is what 12*L*d^2 estimates (Kaplan et al.
        2020, section 2.1). nanoGPT's own count only leaves out wpe."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.transformer.wte.weight.numel()
            if "wpe" in self.transformer:
                n -= self.transformer.wpe.weight.numel()
            if not self.config.tie_embeddings:
                n -= self.lm_head.weight.numel()
        return n

    def _embed(self, idx, start=0):
        B, T = idx.shape
        # a tensor start: its cache is checked
        if isinstance(start, int) and start + T > self.config.block_size:
            raise ValueError(
                f"sequence of {start + T} tokens is longer than "
                f"block_size={self.config.block_size}: crop the context"
            )
        x = self.transformer.wte(idx)  # (B, T, C)
        if self.config.pos_encoding == "learned":
            x = x + self.transformer.wpe(start + torch.arange(T, device=idx.device))
        elif self.config.pos_encoding == "sinusoidal":
            x = x + rows(self.sinusoid, start, T)
        # rope acts inside attention; with none, only the causal mask hints at order
        return self.transformer.drop(x)

    def _hidden(self, idx, cache=None):
        x = self._embed(idx, cache.length if cache is not None else 0)
        for layer, block in enumerate(self.transformer.h):
            x = block(x, cache, layer)
        if cache is not None:
            cache.length += idx.size(1)
        return self.transformer.ln_f(x)  # (B, T, C)

    def _logits(self, x):
        logits = self.lm_head(x)  # (B, T, padded_vocab_size)
        if self.config.padded_vocab_size != self.config.vocab_size:
            logits = logits[..., : self.config.vocab_size]  # padding ids are never predicted
        cap = self.config.logit_softcap
        if cap is not None:  # Gemma 2; modded-nanogpt
            logits = cap * torch.tanh(logits / cap)
        return logits

    def forward(self, idx, targets=None):
        """idx (B, T) token ids -> logits (B, T, vocab_size) and, given targets (B, T),
        the mean cross-entropy in fp32 (targets of -1 are ignored).

        Where some targets are -1 (chat data: only the replies are learned), the output
        layer runs on the N positions that have one: logits (N, vocab_size). On a
        GPT-2-sized vocabulary that layer is most of a small model's step."""
        x = self._hidden(idx)
        if targets is None:
            return self._logits(x), None
        scored = targets >= 0  # (B, T)
        if not torch.compiler.is_compiling() and not scored.all():  # compiled: fixed shapes
            x, targets = x[scored], targets[scored]  # (N, C), (N,)
        logits = self._logits(x)
        loss = F.cross_entropy(
            logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1
        )
        return logits, loss

    @torch.no_grad()
    def attention_maps(self, idx, layer):
        """Softmax weights (B, H, T, T) of every head of block `layer`, computed with the
        reference formula on the same activations as forward (call model.eval() first)."""
        if not 0 <= layer < self.config.n_layer:
            raise ValueError(f"layer={layer} must be in [0, {self.config.n_layer - 1}]")
        x = self._embed(idx)
        for block in self.transformer.h[:layer]:
            x = block(x)
        block = self.transformer.h[layer]
        q, k, v = block.attn.qkv(block.ln_1(x) if block.pre_norm else x)
        _, stages = reference_attention(q, k, v, causal=True, return_stages=True)
        return stages["weights"]

    def crop_block_size(self, block_size):
        """Shrink the context length, e.g. to finetune GPT-2 (1024) at 256."""
        if not 1 <= block_size <= self.config.block_size:
            raise ValueError(f"block_size={block_size} must be in [1, {self.config.block_size}]")
        self.config.block_size = block_size
        if "wpe" in self.transformer:
            self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size])
            self.transformer.wpe.num_embeddings = block_size
        if hasattr(self, "sinusoid"):
            self.sinusoid = self.sinusoid[:block_size]
        for block in self.transformer.h:
            if block.attn.rope:
                block.attn.rope_cos = block.attn.rope_cos[:block_size]
                block.attn.rope_sin = block.attn.rope_sin[:block_size]

    @torch.no_grad()
    def grow_vocab(self, vocab_size):
        """Give a trained model rows for new token ids past its vocabulary (a chat
        dataset's turn tokens): each new row of the token embedding (and of an untied
        output layer) is the mean of the trained rows, an "average token" (Hewitt 2021,
        "Initializing new word embeddings for pretrained language models"), so the new
        ids start near the average probability and the old ids' predictions barely move."""
        old, c = self.config.vocab_size, self.config
        if vocab_size < old:
            raise ValueError(f"cannot shrink a vocabulary of {old} to {vocab_size}")
        c.vocab_size = vocab_size  # this model's own config, as crop_block_size edits it

        def grown(weight):  # (padded vocab, C): the old rows, then their mean
            rows = weight.new_empty(c.padded_vocab_size, weight.shape[1])
            rows[:old], rows[old:] = weight[:old], weight[:old].mean(dim=0)
            return nn.Parameter(rows)

        self.lm_head.weight = grown(self.lm_head.weight)
        self.lm_head.out_features = c.padded_vocab_size
        wte = self.transformer.wte
        wte.weight = self.lm_head.weight if c.tie_embeddings else grown(wte.weight)
        wte.num_embeddings = c.padded_vocab_size

    def next_token_logits(self, idx, cache=None):
        """Logits (B, vocab_size) for the token after the last of idx (B, T).

        With a cache, idx holds only the tokens the cache has not seen yet: their keys
        and values are added to it, and they attend to everything cached before them."""
        return self._logits(self._hidden(idx, cache)[:, -1])

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        """nanoGPT's generate: idx (B, T) -> (B, T + max_new_tokens), running the model
        on the whole context (cropped to block_size) for every new token. Temperature 0
        is greedy. Dropout stays active in train mode: call model.eval() first."""
        for _ in range(max_new_tokens):
            logits = self.next_token_logits(idx[:, -self.config.block_size :])  # (B, vocab_size)
            if temperature == 0:
                next_id = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
            else:
                logits = logits / temperature
                if top_k:
                    logits = filter_top_k(logits, top_k)
                probs = F.softmax(logits, dim=-1)
                next_id = torch.multinomial(probs, num_samples=1, generator=generator)  # (B, 1)
            idx = torch.cat((idx, next_id), dim=1)
        return idx


def filter_top_k(logits, k):
    """Keep the k largest logits of each row (ties with the k-th are kept too)."""
    kth = torch.topk(logits, min(k, logits.size(-1)), dim=-1).values[:, -1:]  # (B, 1)
    return logits.masked_fill(logits < kth, float("-inf"))
