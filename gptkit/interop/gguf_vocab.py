"""Our tokenizers as the vocabulary a GGUF file carries, so that llama.cpp turns text
into exactly our token ids.

    GPT-2 BPE, our trained BPE   llama.cpp's byte-level BPE ("gpt2"): tokens, merges,
                                 GPT-2's pre-tokenizer ("gpt-2"), <|endoftext|> as EOS
    char                         llama.cpp's "rwkv" vocabulary: the longest token that
                                 matches the text's next bytes, which for whole
                                 characters is one character at a time
    a chat model                 the four turn tokens as control tokens after those,
                                 tokenizer.chat_template and <|end|> as end of turn

    python convert.py out-shakespeare-llama shakespeare.gguf --to gguf

A byte-level BPE vocabulary spells every byte as one printable character (GPT-2's
convention: gptkit/interop/hf_tokenizer.byte_symbols), and llama.cpp joins those
symbols by the merges, lowest rank first, inside each piece its pre-tokenizer cuts
with the same GPT-2 pattern as ours.

Why not a byte-level BPE without merges for a character vocabulary: llama.cpp gives
a "gpt2" vocabulary that names no end-of-text token the id 11 as its end of text,
and stops generating there (';' in Tiny Shakespeare's 65 characters: llama-cpp-python
reports id 11 as an end-of-generation token). Its "rwkv" vocabulary has no default
special tokens, and it matches tokens as byte strings, so characters of several
UTF-8 bytes (é, —, 日, 🙂) come out whole too: no character vocabulary is refused.
A token is stored with llama.cpp's rwkv escapes (llama-vocab.cpp,
llama_unescape_rwkv_token): a backslash is written twice, and U+0000 as the escape
\x00, since llama.cpp reads each token string as a C string, which ends at a NUL
(stored raw, the token would become empty and a NUL in a prompt would match nothing).
"""

from dataclasses import dataclass, field

from gptkit.chat import CHAT_TEMPLATE, chat_vocabulary
from gptkit.errors import UserError
from gptkit.interop.hf_tokenizer import EOT, bpe_merges, byte_symbols
from gptkit.tokenizer import GPT2_EOT_ID, load_gpt2_encoding, tokenizer_from_dict

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
    turns: dict | None = None  # a chat model's turn tokens {name: id} (gptkit/chat.py)


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
