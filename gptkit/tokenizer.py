"""Tokenizers: text <-> token ids, rebuilt from the description in meta.json.

Two kinds, chosen by `prepare.py` and stored with the data and in every
checkpoint, so sampling never has to guess:

    {"type": "char", "chars": ["\\n", " ", "!", ...]}   id = position in `chars`
    {"type": "gpt2"}                                  GPT-2 BPE through tiktoken
"""

import numpy as np

from gptkit.errors import UserError

GPT2_EOT_ID = 50256  # "<|endoftext|>" in GPT-2's vocabulary


def load_gpt2_encoding():
    """tiktoken's GPT-2 BPE; offline it needs TIKTOKEN_CACHE_DIR to hold its files."""
    import tiktoken

    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:  # tiktoken raises requests/OS errors when it cannot download
        raise UserError(
            f"could not load the GPT-2 BPE files ({type(e).__name__}: {e}). Offline, point "
            "TIKTOKEN_CACHE_DIR at a folder holding tiktoken's cached GPT-2 files "
            "(this repository's tests use ../shared/data/tiktoken)"
        )


class CharTokenizer:
    def __init__(self, chars):
        self.chars = list(chars)
        self.stoi = {ch: i for i, ch in enumerate(self.chars)}
        self.vocab_size = len(self.chars)
        self.eot_id = None

    def encode(self, text):
        unknown = sorted(set(text) - self.stoi.keys())
        if unknown:
            shown = ", ".join(repr(ch) for ch in unknown[:20])
            raise UserError(
                f"the text has {len(unknown)} character(s) outside this model's character vocabulary: "
                f"{shown}. Use only characters from the training data"
            )
        return [self.stoi[ch] for ch in text]

    def decode(self, ids):
        return "".join(self.chars[i] for i in ids)

    def token_byte_lengths(self):
        """UTF-8 bytes each id adds to decoded text: int64 (vocab_size,), for bits per byte."""
        return np.array([len(ch.encode("utf-8")) for ch in self.chars], dtype=np.int64)

    def to_dict(self):
        return {"type": "char", "chars": self.chars}


class GPT2Tokenizer:
    def __init__(self):
        self.encoding = load_gpt2_encoding()
        self.vocab_size = self.encoding.n_vocab  # 50257
        self.eot_id = GPT2_EOT_ID
        self._byte_lengths = None

    def encode(self, text):
        return self.encoding.encode_ordinary(text)

    def decode(self, ids):
        return self.encoding.decode(list(ids))

    def token_byte_lengths(self):
        """UTF-8 bytes each id adds to decoded text: int64 (vocab_size,), for bits per byte.
        A token may hold part of a character, so its bytes, not its decoded string, are
        counted; <|endoftext|> adds none. Computed once (~50k look-ups) and kept."""
        if self._byte_lengths is None:
            lengths = np.array(
                [len(self.encoding.decode_single_token_bytes(i)) for i in range(self.vocab_size)], dtype=np.int64
            )
            lengths[self.eot_id] = 0
            self._byte_lengths = lengths
        return self._byte_lengths

    def to_dict(self):
        return {"type": "gpt2"}


def tokenizer_from_dict(d):
    """Rebuild a tokenizer from its meta.json / checkpoint description."""
    kind = d.get("type") if isinstance(d, dict) else None
    if kind == "char":
        return CharTokenizer(d["chars"])
    if kind == "gpt2":
        return GPT2Tokenizer()
    raise UserError(f"unknown tokenizer description {d!r}: expected type 'char' or 'gpt2'")


class Tokenizer:
    """Namespace kept for the documented entry point `Tokenizer.from_dict`."""

    from_dict = staticmethod(tokenizer_from_dict)
