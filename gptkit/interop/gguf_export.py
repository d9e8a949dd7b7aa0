"""A checkpoint out as one GGUF file, the format llama.cpp (and Ollama, LM Studio) run.

    python convert.py out-shakespeare-llama shakespeare.gguf --to gguf
    python convert.py out-shakespeare-llama shakespeare-q8.gguf --to gguf --outtype q8_0
    llama-cli -m shakespeare.gguf -p "ROMEO:" -n 200        # docs/gguf.md

The llama.cpp architecture is chosen from the model's settings, and only where
llama.cpp computes what our model does:

    gpt2   LayerNorm, GELU (tanh form), pre-norm; learned positions, or sinusoidal or
           none written as a fixed position table (at least 256 rows, llama.cpp's
           smallest context: gpt2_positions); biases (zeros when bias=False);
           tied or untied head; any number of key/value heads
    llama  RoPE, RMSNorm, SwiGLU, pre-norm, no biases; any number of key/value heads
    qwen3  llama's shape with QK-norm (RMSNorm of each head's q and k before RoPE)

Everything else (ReLU², soft-capped logits, post-norm, exact GELU, RoPE with
LayerNorm, ...) is refused with one line naming the settings, before anything is
written: llama.cpp would run those weights as a different function.

llama.cpp's `llama` rotates neighbouring pairs (x[2i], x[2i+1]) of each head; we rotate
(x[i], x[i + D/2]) (model.apply_rope). Rotating both q and k on a permuted basis leaves
q·k unchanged, so the rows of q and k are reordered so that our pair i lands on
llama.cpp's pair i, as llama.cpp's own converter does for Hugging Face's layout.
`qwen3` rotates the halves like we do: nothing to reorder.

The file is written under a temporary name in DEST's folder, fsynced and renamed
only if nothing appeared at DEST meanwhile (gptkit/ops/atomic.py): an error, a full
disk, Ctrl-C or SIGTERM never leaves a file that looks complete, nor any temporary.
f16 and q8_0 refuse a weight they cannot hold (beyond 65504, or a q8_0 block scale
beyond it) instead of writing infinity.

The tokenizer goes in as llama.cpp's vocabulary: the last section, `gguf_vocab`.
"""

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from gptkit.ops.atomic import atomic_write
from gptkit.data.chat import CHAT_TEMPLATE, chat_vocabulary
from gptkit.ops.device import F16_MAX, F16_OVERFLOW
from gptkit.ops.errors import UserError
from gptkit.interop import check_mapped_names, missing_weight
from gptkit.interop.hf_llama import llama_block
from gptkit.interop.hf_tokenizer import EOT, bpe_merges, byte_symbols
from gptkit.ops.paths import claim_output
from gptkit.data.tokenizer import GPT2_EOT_ID, load_gpt2_encoding, tokenizer_from_dict

OUTTYPES = ("f32", "f16", "q8_0")
Q8_BLOCK = 32  # q8_0 quantizes blocks of 32 values along a row; other rows stay f16

# llama.cpp architecture -> the GPTConfig values it computes (a tuple: any of these).
ARCHITECTURES = {
    "gpt2": {
        "pos_encoding": ("learned", "sinusoidal", "none"), "norm": ("layernorm",), "norm_placement": ("pre",),
        "mlp": ("gelu",), "qk_norm": (False,), "logit_softcap": (None,),
    },
    "llama": {
        "pos_encoding": ("rope",), "norm": ("rmsnorm",), "norm_placement": ("pre",), "mlp": ("swiglu",),
        "bias": (False,), "qk_norm": (False,), "logit_softcap": (None,),
    },
    "qwen3": {
        "pos_encoding": ("rope",), "norm": ("rmsnorm",), "norm_placement": ("pre",), "mlp": ("swiglu",),
        "bias": (False,), "qk_norm": (True,), "logit_softcap": (None,),
    },
}


def mismatches(config, architecture):
    """['setting=value (arch needs ...)'] for what `architecture` cannot compute."""
    return [
        f"{name}={getattr(config, name)!r} ({architecture} needs {' or '.join(map(repr, allowed))})"
        for name, allowed in ARCHITECTURES[architecture].items()
        if getattr(config, name) not in allowed
    ]


def gguf_architecture(config):
    """'gpt2', 'llama' or 'qwen3': the llama.cpp architecture that computes what `config` does."""
    for architecture in ARCHITECTURES:
        if not mismatches(config, architecture):
            return architecture
    rope_family = min(("llama", "qwen3"), key=lambda a: len(mismatches(config, a)))
    raise UserError(
        "this model maps onto no llama.cpp architecture, nothing was written: as gpt2 it has "
        + ", ".join(mismatches(config, "gpt2")) + f"; as {rope_family} it has "
        + ", ".join(mismatches(config, rope_family))
        + ". Models that export: GPT-2's architecture (configs/gpt2.py) or LLaMA's "
        "(configs/shakespeare_llama.py trains one on a CPU in minutes), optionally with qk_norm=True"
    )


def rotary_to_neighbour_pairs(w, n_heads):
    """Reorder the rows of a q or k projection (n_heads*D, C) so that each head's pair
    (i, i + D/2) becomes the neighbours (2i, 2i + 1) llama.cpp's `llama` rotates."""
    rows, C = w.shape
    D = rows // n_heads
    return w.reshape(n_heads, 2, D // 2, C).transpose(1, 2).reshape(rows, C)  # (H, D/2, 2, C) flattened


GGUF_NAMES = {  # hf_llama.llama_block's roles -> llama.cpp's tensor names in a block
    "attn_norm": "attn_norm.weight", "q": "attn_q.weight", "k": "attn_k.weight", "v": "attn_v.weight",
    "o": "attn_output.weight", "ffn_norm": "ffn_norm.weight", "gate": "ffn_gate.weight", "up": "ffn_up.weight",
    "down": "ffn_down.weight",
}
LLAMA_CPP_MIN_CONTEXT = 256  # llama-context.cpp rounds every context up to a multiple of 256


def gpt2_positions(config):
    """Rows of gpt2's position table. llama.cpp runs at least 256 positions whatever the
    model's context, and reading a row past the table aborts it (a GGML_ASSERT in
    get_rows, measured), so the table is rounded up to a multiple of 256 rows: learned
    rows past block_size are zeros (no position signal: the model never trained
    there), sinusoidal and absent positions continue their formula."""
    return -(-config.block_size // LLAMA_CPP_MIN_CONTEXT) * LLAMA_CPP_MIN_CONTEXT


def gpt2_tensors(model, sd):
    """llama.cpp's gpt2 names -> fp32 tensors; absent biases become zeros (gpt2 needs them all)."""
    c = model.config
    V = c.vocab_size

    def bias(key, size):
        return sd[key] if key in sd else torch.zeros(size)

    rows = gpt2_positions(c)
    if c.pos_encoding == "learned":  # rows past block_size: zeros (see gpt2_positions)
        positions = torch.cat([sd["transformer.wpe.weight"], torch.zeros(rows - c.block_size, c.n_embd)])
    elif c.pos_encoding == "sinusoidal":
        from model import sinusoidal_table  # the same table the model adds, continued

        positions = sinusoidal_table(rows, c.n_embd)
    else:  # no positions: a table of zeros adds nothing
        positions = torch.zeros(rows, c.n_embd)
    out = {"token_embd.weight": sd["transformer.wte.weight"][:V], "position_embd.weight": positions}
    for i in range(c.n_layer):
        p, q = f"transformer.h.{i}.", f"blk.{i}."
        qkv = sd[p + "attn.c_attn.weight"]
        out.update({
            q + "attn_norm.weight": sd[p + "ln_1.weight"],
            q + "attn_norm.bias": bias(p + "ln_1.bias", c.n_embd),
            q + "attn_qkv.weight": qkv,  # [q | k | v], head by head: the split llama.cpp makes
            q + "attn_qkv.bias": bias(p + "attn.c_attn.bias", qkv.shape[0]),
            q + "attn_output.weight": sd[p + "attn.c_proj.weight"],
            q + "attn_output.bias": bias(p + "attn.c_proj.bias", c.n_embd),
            q + "ffn_norm.weight": sd[p + "ln_2.weight"],
            q + "ffn_norm.bias": bias(p + "ln_2.bias", c.n_embd),
            q + "ffn_up.weight": sd[p + "mlp.c_fc.weight"],
            q + "ffn_up.bias": bias(p + "mlp.c_fc.bias", c.hidden_size),
            q + "ffn_down.weight": sd[p + "mlp.c_proj.weight"],
            q + "ffn_down.bias": bias(p + "mlp.c_proj.bias", c.n_embd),
        })
    out["output_norm.weight"] = sd["transformer.ln_f.weight"]
    out["output_norm.bias"] = bias("transformer.ln_f.bias", c.n_embd)
    if not c.tie_embeddings:  # tied: llama.cpp reads token_embd for the output
        out["output.weight"] = sd["lm_head.weight"][:V]
    return out


def llama_tensors(model, sd, architecture):
    """llama.cpp's llama/qwen3 names -> fp32 tensors, q and k reordered for `llama`'s RoPE."""
    c = model.config
    H, Hkv, V = c.n_head, c.kv_heads, c.vocab_size
    out = {"token_embd.weight": sd["transformer.wte.weight"][:V]}
    for i in range(c.n_layer):
        p, q = f"transformer.h.{i}.", f"blk.{i}."
        block = llama_block(sd, c, i)
        if architecture == "llama":
            block["q"], block["k"] = rotary_to_neighbour_pairs(block["q"], H), rotary_to_neighbour_pairs(block["k"], Hkv)
        out.update({q + GGUF_NAMES[role]: tensor for role, tensor in block.items()})
        if c.qk_norm:
            out[q + "attn_q_norm.weight"] = sd[p + "attn.q_norm.weight"]
            out[q + "attn_k_norm.weight"] = sd[p + "attn.k_norm.weight"]
    out["output_norm.weight"] = sd["transformer.ln_f.weight"]
    if not c.tie_embeddings:
        out["output.weight"] = sd["lm_head.weight"][:V]
    return out


def add_hyperparameters(writer, config, architecture, name):
    import gguf

    from model import NORM_EPS

    c = config
    writer.add_name(name)
    writer.add_context_length(gpt2_positions(c) if architecture == "gpt2" else c.block_size)
    writer.add_embedding_length(c.n_embd)
    writer.add_block_count(c.n_layer)
    writer.add_feed_forward_length(c.hidden_size)
    writer.add_head_count(c.n_head)
    writer.add_head_count_kv(c.kv_heads)
    if architecture == "gpt2":
        writer.add_layer_norm_eps(NORM_EPS)
    else:
        writer.add_layer_norm_rms_eps(NORM_EPS)  # qwen3 uses it for the q and k norms too, as we do
        writer.add_rope_dimension_count(c.head_dim)
        writer.add_rope_freq_base(c.rope_theta)
        writer.add_key_length(c.head_dim)
        writer.add_value_length(c.head_dim)
    writer.add_vocab_size(c.vocab_size)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


ALWAYS_F32 = ("position_embd.weight",)  # llama.cpp's converter always writes it in f32


def encode_tensor(name, tensor, outtype):
    """(numpy data, gguf type) for one tensor: 1-D ones (norms, biases) and the position
    table stay f32, as llama.cpp's converter writes them; q8_0 needs rows that are a
    multiple of 32 values, other matrices go f16. A value that the lossy type cannot
    hold (beyond f16's 65504, or a q8_0 block whose f16 scale, its largest value / 127,
    would be) is refused (UserError naming the tensor) instead of written as infinity."""
    import gguf

    data = tensor.detach().float().cpu().contiguous().numpy()
    if outtype == "f32" or data.ndim == 1 or name in ALWAYS_F32:
        return data, gguf.GGMLQuantizationType.F32
    largest = float(np.abs(data).max()) if data.size else 0.0
    if outtype == "q8_0" and data.shape[-1] % Q8_BLOCK == 0:
        if largest / 127 >= F16_OVERFLOW:  # gguf.quants stores each block's scale, max |x| / 127, as f16
            raise UserError(f"--outtype q8_0: {name} holds {largest:.6g}, whose q8_0 block scale ({largest:.6g} / 127) "
                            f"is beyond f16's largest value {F16_MAX:g} and would be written as infinity; "
                            f"export with --outtype f32 (nothing was written)")
        q = gguf.GGMLQuantizationType.Q8_0
        return gguf.quants.quantize(data, q), q
    if largest >= F16_OVERFLOW:
        raise UserError(f"--outtype {outtype}: {name} holds {largest:.6g}, beyond f16's largest value {F16_MAX:g}: "
                        f"it would be written as infinity; export with --outtype f32 (nothing was written)")
    return data.astype(np.float16), gguf.GGMLQuantizationType.F16


FILE_TYPES = {"f32": 0, "f16": 1, "q8_0": 7}  # gguf.LlamaFileType: ALL_F32, MOSTLY_F16, MOSTLY_Q8_0


def write_gguf(path, architecture, config, vocab, encoded, outtype, name):
    """Write the GGUF file at `path` (overwritten): metadata, vocabulary, and the
    tensors `encoded` {name: (data, gguf type)} (encode_tensor's)."""
    import gguf

    writer = gguf.GGUFWriter(path, architecture)
    try:
        add_hyperparameters(writer, config, architecture, name)
        writer.add_file_type(FILE_TYPES[outtype])
        add_vocab(writer, vocab)
        for tensor_name, (data, qtype) in encoded.items():
            writer.add_tensor(tensor_name, data, raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.flush()
    finally:
        writer.close()


def export_gguf(source, dest, outtype="f16", data_dir="data"):
    """Write the model in `source` (a run folder or checkpoint) and its tokenizer as the
    GGUF file `dest`; returns a summary to print."""
    from gptkit.interop.export import load_source

    if outtype not in OUTTYPES:
        raise UserError(f"--outtype {outtype} is not one of {', '.join(OUTTYPES)}")
    dest = claim_output(dest, "file", what="DEST")  # a new file, in a folder that takes one
    try:
        import gguf  # noqa: F401  (a requirement; checked before the model is loaded)
    except ImportError:
        raise UserError("writing GGUF needs the gguf package: pip install -r requirements.txt")
    model, tokenizer, summary = load_source(source, data_dir)
    architecture = gguf_architecture(model.config)  # before anything is written
    vocab = gguf_vocab(tokenizer.to_dict(), model.config.vocab_size)
    sd = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    check_mapped_names(sd, "--to gguf")
    try:
        tensors = gpt2_tensors(model, sd) if architecture == "gpt2" else llama_tensors(model, sd, architecture)
    except KeyError as e:
        raise missing_weight(e, "--to gguf")
    encoded = {name: encode_tensor(name, tensor, outtype) for name, tensor in tensors.items()}  # checked first
    name = Path(source).resolve().parent.name if Path(source).is_file() else Path(source).resolve().name
    # A new name: published only if nothing appeared there meanwhile (gptkit/ops/atomic.py).
    with atomic_write(dest, replace=False, kept="no partial file was left") as tmp:
        write_gguf(tmp, architecture, model.config, vocab, encoded, outtype, name)
    lines = [summary, f"wrote {dest}: llama.cpp architecture {architecture}, {outtype}, "
                      f"{vocab.kind} tokenizer as llama.cpp's {vocab.model} ({dest.stat().st_size / 1e6:.2f} MB)"]
    c = model.config
    if c.block_size % LLAMA_CPP_MIN_CONTEXT:
        lines.append(
            f"note: llama.cpp runs at least {gpt2_positions(c)} positions and this model was trained on "
            f"{c.block_size}: past {c.block_size} tokens of prompt and output its text departs from sample.py's, "
            f"which slides a {c.block_size}-token window"
        )
    return "\n".join(lines)


# ---- the vocabulary ----------------------------------------------------------------------
# Our tokenizers as the vocabulary a GGUF file carries, so that llama.cpp turns text
# into exactly our token ids.
#
#     GPT-2 BPE, our trained BPE   llama.cpp's byte-level BPE ("gpt2"): tokens, merges,
#                                  GPT-2's pre-tokenizer ("gpt-2"), <|endoftext|> as EOS
#     char                         llama.cpp's "rwkv" vocabulary: the longest token that
#                                  matches the text's next bytes, which for whole
#                                  characters is one character at a time
#     a chat model                 the four turn tokens as control tokens after those,
#                                  tokenizer.chat_template and <|end|> as end of turn
#
#     python convert.py out-shakespeare-llama shakespeare.gguf --to gguf
#
# A byte-level BPE vocabulary spells every byte as one printable character (GPT-2's
# convention: gptkit/interop/hf_tokenizer.byte_symbols), and llama.cpp joins those
# symbols by the merges, lowest rank first, inside each piece its pre-tokenizer cuts
# with the same GPT-2 pattern as ours.
#
# Why not a byte-level BPE without merges for a character vocabulary: llama.cpp gives
# a "gpt2" vocabulary that names no end-of-text token the id 11 as its end of text,
# and stops generating there (';' in Tiny Shakespeare's 65 characters: llama-cpp-python
# reports id 11 as an end-of-generation token). Its "rwkv" vocabulary has no default
# special tokens, and it matches tokens as byte strings, so characters of several
# UTF-8 bytes (é, —, 日, 🙂) come out whole too: no character vocabulary is refused.
# A token is stored with llama.cpp's rwkv escapes (llama-vocab.cpp,
# llama_unescape_rwkv_token): a backslash is written twice, and U+0000 as the escape
# \x00, since llama.cpp reads each token string as a C string, which ends at a NUL
# (stored raw, the token would become empty and a NUL in a prompt would match nothing).

NORMAL, CONTROL, UNUSED = 1, 3, 5  # gguf.TokenType's values (llama.cpp's token types)


@dataclass
class Vocab:
    """What a GGUF file stores about its tokenizer (tokenizer.ggml.*)."""

    model: str  # llama.cpp's tokenizer model: "gpt2" (byte-level BPE) or "rwkv"
    tokens: list  # id -> token text as llama.cpp reads it
    types: list  # id -> NORMAL, CONTROL or UNUSED
    merges: list = field(default_factory=list)  # "left right", rank order (gpt2 only)
    eot_id: int | None = None
    kind: str = ""  # our tokenizer type, for messages
    turns: dict | None = None  # a chat model's turn tokens {name: id} (gptkit/data/chat.py)


def spell(token_bytes, symbols=byte_symbols()):
    return "".join(symbols[b] for b in token_bytes)


def bpe_vocab(token_bytes, eot_id, kind):
    """A byte-level BPE whose id i is token_bytes[i] (its rank), plus <|endoftext|> at eot_id."""
    ranks = {b: i for i, b in enumerate(token_bytes)}
    tokens = [spell(b) for b in token_bytes]
    assert eot_id == len(tokens), f"<|endoftext|> at {eot_id}, expected right after the {len(tokens)} tokens"
    merges = [f"{spell(a)} {spell(b)}" for a, b in bpe_merges(ranks)]
    return Vocab("gpt2", tokens + [EOT], [NORMAL] * len(tokens) + [CONTROL], merges, eot_id, kind)


def rwkv_escaped(ch):
    """One character as llama.cpp's rwkv vocabulary spells it: a backslash twice, NUL as \\x00."""
    return {"\\": "\\\\", "\0": "\\x00"}.get(ch, ch)


def char_vocab(chars):
    """Each character a token of its own, spelled with the rwkv escapes (rwkv_escaped)."""
    if len(set(chars)) != len(chars) or not all(isinstance(ch, str) and len(ch) == 1 for ch in chars):
        raise UserError("this character vocabulary is not a list of distinct single characters: it cannot be exported")
    return Vocab("rwkv", [rwkv_escaped(ch) for ch in chars], [NORMAL] * len(chars), kind="char")


def gguf_vocab(tokenizer_dict, vocab_size):
    """The Vocab of the tokenizer a checkpoint describes, padded with unused tokens up
    to the model's vocab_size (the rows of its embedding that no text encodes to)."""
    kind = tokenizer_dict.get("type") if isinstance(tokenizer_dict, dict) else None
    if kind == "gpt2":
        ranks = load_gpt2_encoding()._mergeable_ranks  # {token bytes: id}; tiktoken keeps no public accessor
        vocab = bpe_vocab(sorted(ranks, key=ranks.get), GPT2_EOT_ID, "gpt2")
    elif kind == "bpe":
        tokenizer = tokenizer_from_dict(tokenizer_dict)  # checks its sha256
        vocab = bpe_vocab(tokenizer.token_bytes, tokenizer.eot_id, "bpe")
    elif kind == "char":
        vocab = char_vocab(tokenizer_dict["chars"])
    else:
        raise UserError(f"exporting a {kind!r} tokenizer to GGUF is not supported (gpt2, bpe and char are)")
    if len(vocab.tokens) > vocab_size:
        raise UserError(f"the tokenizer has {len(vocab.tokens)} tokens but the model only {vocab_size}")
    vocab.turns = chat_vocabulary(vocab_size, len(vocab.tokens))
    if vocab.turns is not None:  # a chat model: its turn tokens are control tokens, as llama.cpp's own chat models'
        vocab.tokens += list(vocab.turns)
        vocab.types += [CONTROL] * len(vocab.turns)
    n_pad = vocab_size - len(vocab.tokens)
    # rwkv matches any token's bytes in the text: there a padding token starts with the
    # byte 0xFF (an rwkv escape), which no UTF-8 text holds
    pad = "\\xff[PAD{}]" if vocab.model == "rwkv" else "[PAD{}]"
    vocab.tokens += [pad.format(i) for i in range(n_pad)]
    vocab.types += [UNUSED] * n_pad
    return vocab


def add_vocab(writer, vocab):
    """Store `vocab` in a gguf.GGUFWriter (the tokenizer.ggml.* keys llama.cpp reads)."""
    writer.add_tokenizer_model(vocab.model)
    if vocab.model == "gpt2":
        writer.add_tokenizer_pre("gpt-2")  # GPT-2's pattern, which our BPEs cut text with too
        writer.add_token_merges(vocab.merges)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    # A chat model's generation ends with its turn: <|end|> is its end of sequence (llama-cpp-python's
    # chat completion stops at that token's text; with none it would stop at once, on "")
    eos = vocab.turns["<|end|>"] if vocab.turns is not None else vocab.eot_id
    if eos is not None:
        writer.add_eos_token_id(eos)
    if vocab.eot_id is not None:
        writer.add_bos_token_id(vocab.eot_id)  # GPT-2's convention; never added to a prompt:
    writer.add_add_bos_token(False)  # we train without a BOS token
    writer.add_add_eos_token(False)
    if vocab.turns is not None:
        writer.add_chat_template(CHAT_TEMPLATE)  # tokenizer.chat_template: llama-cpp-python formats with it
        writer.add_eot_token_id(vocab.turns["<|end|>"])  # generation ends with the turn
