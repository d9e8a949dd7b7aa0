"""Our tokenizers as the vocabulary a GGUF file carries, so that llama.cpp turns text
into exactly our token ids.

    GPT-2 BPE, our trained BPE   llama.cpp's byte-level BPE ("gpt2"): tokens, merges,
                                 GPT-2's pre-tokenizer ("gpt-2"), <|endoftext|> as EOS
    char                         the same byte-level BPE: each character is a token
                                 spelled in its UTF-8 bytes; a character of several
                                 bytes is rebuilt by merges of its own bytes, in order

    python convert.py out-shakespeare-llama shakespeare.gguf --to gguf

A byte-level BPE vocabulary spells every byte as one printable character (GPT-2's
convention: gptkit/interop/hf_tokenizer.byte_symbols), and llama.cpp joins those
symbols by the merges, lowest rank first, inside each piece its pre-tokenizer cuts
(the same GPT-2 pattern as ours). For a character vocabulary no merge is needed when
every character is one byte (Tiny Shakespeare's 65); a character of several bytes b1
b2 b3 gets the merges (b1, b2) and (b1b2, b3). A merge's left side always starts with
a UTF-8 lead byte and its right side is a continuation byte, so no merge can join
the bytes of two neighbouring characters: each character comes back whole.

llama.cpp gives a byte-level BPE that names no end-of-text token the id 11 as its
EOS, and stops generating there. A character vocabulary has no end-of-text token,
so llama.cpp would stop at whatever character has id 11 (';' in Tiny Shakespeare's
vocabulary): `char_vocab_warning` says so.
"""

from dataclasses import dataclass, field

from gptkit.errors import UserError
from gptkit.interop.hf_tokenizer import EOT, bpe_merges, byte_symbols
from gptkit.tokenizer import GPT2_EOT_ID, load_gpt2_encoding, tokenizer_from_dict

NORMAL, CONTROL, UNUSED = 1, 3, 5  # gguf.TokenType's values (llama.cpp's token types)
# llama.cpp refuses a "gpt2" vocabulary without merges, and the gguf package cannot
# write an empty list: a vocabulary of single bytes gets one merge that never applies,
# of two 0xFF bytes, which no UTF-8 text contains.
NEVER_MERGED = f"{byte_symbols()[0xFF]} {byte_symbols()[0xFF]}"
LLAMA_CPP_DEFAULT_EOS = 11  # llama-vocab.cpp: special_eos_id for a "gpt2" vocabulary that names none


@dataclass
class Vocab:
    """What a GGUF file stores about its tokenizer (tokenizer.ggml.*)."""

    tokens: list  # id -> token text, in byte symbols
    types: list  # id -> NORMAL, CONTROL or UNUSED
    merges: list = field(default_factory=list)  # "left right", rank order
    eot_id: int | None = None
    kind: str = ""  # our tokenizer type, for messages


def spell(token_bytes, symbols=byte_symbols()):
    return "".join(symbols[b] for b in token_bytes)


def bpe_vocab(token_bytes, eot_id, kind):
    """A byte-level BPE whose id i is token_bytes[i] (its rank), plus <|endoftext|> at eot_id."""
    ranks = {b: i for i, b in enumerate(token_bytes)}
    tokens = [spell(b) for b in token_bytes]
    assert eot_id == len(tokens), f"<|endoftext|> at {eot_id}, expected right after the {len(tokens)} tokens"
    merges = [f"{spell(a)} {spell(b)}" for a, b in bpe_merges(ranks)]
    return Vocab(tokens + [EOT], [NORMAL] * len(tokens) + [CONTROL], merges, eot_id, kind)


def char_vocab(chars):
    """Each character a token spelled in its UTF-8 bytes; merges rebuild the multi-byte ones."""
    if len(set(chars)) != len(chars) or not all(isinstance(ch, str) and len(ch) == 1 for ch in chars):
        raise UserError("this character vocabulary is not a list of distinct single characters: it cannot be exported")
    merges = {}  # insertion-ordered set
    for ch in chars:
        raw = ch.encode("utf-8")
        for k in range(1, len(raw)):
            merges[f"{spell(raw[:k])} {spell(raw[k:k + 1])}"] = None
    if not merges:
        merges[NEVER_MERGED] = None
    return Vocab([spell(ch.encode("utf-8")) for ch in chars], [NORMAL] * len(chars), list(merges), None, "char")


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
    n_pad = vocab_size - len(vocab.tokens)
    vocab.tokens += [f"[PAD{i}]" for i in range(n_pad)]
    vocab.types += [UNUSED] * n_pad
    return vocab


def char_vocab_warning(vocab):
    """A note when llama.cpp will stop generating at a real character (see the module
    docstring), else None."""
    if vocab.eot_id is None and len(vocab.tokens) > LLAMA_CPP_DEFAULT_EOS:
        ch = bytes(b for b in (SYMBOL_BYTES[s] for s in vocab.tokens[LLAMA_CPP_DEFAULT_EOS])).decode("utf-8")
        return (
            f"note: a character vocabulary has no end-of-text token, and llama.cpp then takes id "
            f"{LLAMA_CPP_DEFAULT_EOS} ({ch!r}) as one: generation there stops at the first {ch!r}"
        )
    return None


SYMBOL_BYTES = {s: b for b, s in byte_symbols().items()}


def add_vocab(writer, vocab):
    """Store `vocab` in a gguf.GGUFWriter (the tokenizer.ggml.* keys llama.cpp reads)."""
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")  # GPT-2's pattern, which our BPEs cut text with too
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    writer.add_token_merges(vocab.merges)  # llama.cpp refuses a "gpt2" vocabulary without the key
    if vocab.eot_id is not None:
        writer.add_eos_token_id(vocab.eot_id)
        writer.add_bos_token_id(vocab.eot_id)  # GPT-2's convention; never added to a prompt:
    writer.add_add_bos_token(False)  # we train without a BOS token
    writer.add_add_eos_token(False)
