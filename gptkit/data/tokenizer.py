"""Tokenizers: text <-> token ids, rebuilt from the description in meta.json.

Two kinds, chosen by `prepare.py` and stored with the data and in every
checkpoint, so sampling never has to guess:

    {"type": "char", "chars": ["\\n", " ", "!", ...]}   id = position in `chars`
    {"type": "gpt2"}                                  GPT-2 BPE through tiktoken
    {"type": "bpe", "sha256": ..., "json": "..."}    a BPE trained by prepare.py (BPETokenizer)
"""

import hashlib
import json
import numpy as np

from gptkit.ops.errors import UserError

GPT2_EOT_ID = 50256  # "<|endoftext|>" in GPT-2's vocabulary
GPT2_VOCAB_SIZE = 50257


def load_gpt2_encoding():
    """tiktoken's GPT-2 BPE; offline it needs TIKTOKEN_CACHE_DIR to hold its files."""
    import tiktoken

    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:  # tiktoken raises requests/OS errors when it cannot download
        raise UserError(
            f"could not load the GPT-2 BPE files ({type(e).__name__}: {e}). Offline, point "
            "TIKTOKEN_CACHE_DIR at a local copy of tiktoken's cached GPT-2 files"
        )


class CharTokenizer:
    def __init__(self, chars):
        self.chars = list(chars)
        self.stoi = {ch: i for i, ch in enumerate(self.chars)}
        self.vocab_size = len(self.chars)
        self.eot_id = None

    def unknown(self, text):
        """The characters of text this vocabulary lacks, sorted."""
        return sorted(set(text) - self.stoi.keys())

    def encode(self, text):
        unknown = self.unknown(text)
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


def check_description(d, source):
    """The vocabulary size of a tokenizer description (meta.json's or a checkpoint's),
    after checking it as untrusted input: a UserError naming `source` otherwise."""
    kind = d.get("type") if isinstance(d, dict) else None
    if kind == "char":
        chars = d.get("chars")
        if not isinstance(chars, list) or not chars or not all(isinstance(c, str) and len(c) == 1 for c in chars):
            raise UserError(f"{source}: its character tokenizer's \"chars\" must be a non-empty list of single characters")
        if len(set(chars)) != len(chars):
            raise UserError(f"{source}: its character tokenizer lists some character twice")
        bad = next((c for c in chars if 0xD800 <= ord(c) <= 0xDFFF), None)
        if bad is not None:
            raise UserError(f"{source}: its character tokenizer holds U+{ord(bad):04X}, a lone surrogate (not a character)")
        return len(chars)
    if kind == "gpt2":
        return GPT2_VOCAB_SIZE
    if kind == "bpe":  # meta.json's pointer to tokenizer.json must be embedded first (embed_bpe_file)
        try:
            return bpe_from_dict(d).vocab_size
        except UserError as e:
            raise UserError(f"{source}: {e}")
    raise UserError(f"{source}: unknown tokenizer description {str(d)[:200]}: expected type 'char', 'gpt2' or 'bpe'")


def tokenizer_from_dict(d):
    """Rebuild a tokenizer from its meta.json / checkpoint description."""
    kind = d.get("type") if isinstance(d, dict) else None
    if kind == "char":
        check_description(d, "the character tokenizer")
        return CharTokenizer(d["chars"])
    if kind == "gpt2":
        return GPT2Tokenizer()
    if kind == "bpe":
        return bpe_from_dict(d)
    raise UserError(f"unknown tokenizer description {str(d)[:200]}: expected type 'char', 'gpt2' or 'bpe'")


class Tokenizer:
    """Namespace kept for the documented entry point `Tokenizer.from_dict`."""

    from_dict = staticmethod(tokenizer_from_dict)


# ---------------------------------------------------------------- a BPE trained on your text

# GPT-2's pre-tokenizer, as tiktoken writes it (tiktoken_ext/openai_public.py). Text is
# first cut into these pieces (a word with its leading space, a number, a run of
# punctuation, whitespace) and merges never cross them. We keep GPT-2's choice rather
# than a digit-splitting variant (nanochat's \p{N}{1,3}): prepare.py's parallel
# encoder cuts text only where this exact pattern is proven to cut anyway
# (gptkit/prepare/encode.py), which keeps the bins identical to encoding each
# document whole; and on prose the two differ only inside long numbers.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT = "<|endoftext|>"
BPE_FILE = "tokenizer.json"  # its name in a dataset folder
BPE_FORMAT = "gptkit-bpe"
BPE_FORMAT_VERSION = 1
MIN_BPE_VOCAB = 256 + 1  # every byte, and <|endoftext|>
MAX_BPE_VOCAB = 1 << 32  # ids must fit uint32, the widest dtype of the bins
MAX_BPE_FILE_BYTES = 256 << 20  # tokenizer.json: a million tokens take ~20 MB


class BPETokenizer:
    """A byte-level BPE: ids 0..255 are the 256 bytes, each later id one learned merge
    (in the order learned, which is also tiktoken's rank), and the last id <|endoftext|>.

    Every string encodes (there are no unknown tokens) and decodes back exactly.
    tiktoken does the encoding and decoding. The tokenizer is data: `to_json()` is
    the whole of it, the text of tokenizer.json, and `from_json` rebuilds it."""

    def __init__(self, token_bytes, pattern=GPT2_PATTERN):
        import tiktoken

        self.token_bytes = [bytes(b) for b in token_bytes]  # id -> its bytes, <|endoftext|> excluded
        self.pattern = pattern
        self.eot_id = len(self.token_bytes)
        self.vocab_size = self.eot_id + 1
        self.encoding = tiktoken.Encoding(
            name=BPE_FORMAT,
            pat_str=pattern,
            mergeable_ranks={b: i for i, b in enumerate(self.token_bytes)},
            special_tokens={EOT: self.eot_id},
        )
        self._json = None

    def encode(self, text):
        return self.encoding.encode_ordinary(text)  # "<|endoftext|>" in text is plain text, as for gpt2

    def decode(self, ids):
        return self.encoding.decode(list(ids))  # half a UTF-8 character shows as U+FFFD

    def token_byte_lengths(self):
        """UTF-8 bytes each id adds to decoded text (<|endoftext|> adds none): for bits per byte."""
        import numpy as np

        return np.array([len(b) for b in self.token_bytes] + [0], dtype=np.int64)

    def to_json(self):
        """tokenizer.json's text: deterministic, one token per line.

        A token's bytes are written as a string of the code points 0-255 (latin-1),
        so ASCII tokens read as themselves (" the", "ing") and every byte string
        has exactly one spelling."""
        if self._json is None:
            header = {
                "format": BPE_FORMAT,
                "version": BPE_FORMAT_VERSION,
                "pre_tokenizer": "gpt2",
                "pattern": self.pattern,
                "vocab_size": self.vocab_size,
                "special_tokens": {EOT: self.eot_id},
            }
            lines = [f"  {json.dumps(k)}: {json.dumps(v)}," for k, v in header.items()]
            tokens = ",\n".join("    " + json.dumps(b.decode("latin-1")) for b in self.token_bytes)
            self._json = "{\n" + "\n".join(lines) + '\n  "tokens": [\n' + tokens + "\n  ]\n}\n"
        return self._json

    @property
    def sha256(self):
        return hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()

    def describe(self):
        """meta.json's description: the file holds the tokenizer, its sha256 pins it."""
        return {"type": "bpe", "file": BPE_FILE, "sha256": self.sha256, "vocab_size": self.vocab_size, "pre_tokenizer": "gpt2"}

    def to_dict(self):
        """The self-contained description a checkpoint embeds (tokenizer.json's text included)."""
        return self.describe() | {"json": self.to_json()}

    @classmethod
    def from_json(cls, text, source="tokenizer.json"):
        """Rebuild from tokenizer.json's text, checking it (a UserError naming `source`)."""
        try:
            d = json.loads(text)
        except (ValueError, TypeError, RecursionError) as e:  # ValueError: a number of 4,300+ digits too
            raise UserError(f"{source} is not valid JSON ({str(e)[:200] or 'nested too deeply'})")
        if not isinstance(d, dict) or d.get("format") != BPE_FORMAT:
            raise UserError(f"{source} is not a {BPE_FORMAT} tokenizer file (no \"format\": \"{BPE_FORMAT}\")")
        if not isinstance(d.get("version"), int) or d["version"] > BPE_FORMAT_VERSION:
            raise UserError(f"{source} has version {d.get('version')!r}; this code reads up to {BPE_FORMAT_VERSION}")
        if d.get("pattern") != GPT2_PATTERN:
            raise UserError(f"{source}: its pre-tokenizer pattern is not GPT-2's, the only one this code encodes with")
        tokens = d.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, str) and t for t in tokens):
            raise UserError(f"{source}: \"tokens\" must be a list of non-empty strings")
        try:
            token_bytes = [t.encode("latin-1") for t in tokens]
        except UnicodeEncodeError:
            raise UserError(f"{source}: a token holds a character above U+00FF (tokens spell bytes as U+0000-U+00FF)")
        if token_bytes[:256] != [bytes([i]) for i in range(256)]:
            raise UserError(f"{source}: ids 0-255 must be the 256 single bytes, in order")
        if len(set(token_bytes)) != len(token_bytes):
            raise UserError(f"{source}: some token appears twice")
        if d.get("vocab_size") != len(tokens) + 1 or d.get("special_tokens") != {EOT: len(tokens)}:
            raise UserError(f"{source}: vocab_size and special_tokens must be len(tokens) + 1 and {{{EOT!r}: len(tokens)}}")
        tokenizer = cls(token_bytes, d["pattern"])
        tokenizer._json = text  # the exact text that was hashed
        return tokenizer


def bpe_from_dict(d):
    """A BPETokenizer from a checkpoint's (or resolved meta.json's) description."""
    text = d.get("json")
    if not isinstance(text, str):
        raise UserError(
            f"this BPE tokenizer description holds no tokenizer (only a pointer to {d.get('file', BPE_FILE)}): "
            "read a dataset's meta.json with gptkit.data.dataset.load_meta, which adds the file's contents"
        )
    if hashlib.sha256(text.encode("utf-8")).hexdigest() != d.get("sha256"):
        raise UserError("the embedded BPE tokenizer does not match its sha256: the checkpoint or meta.json is damaged")
    return BPETokenizer.from_json(text, "the embedded tokenizer")


def embed_bpe_file(description, folder):
    """meta.json's BPE description with tokenizer.json's text added, after checking its sha256."""
    from pathlib import Path

    from gptkit.ops.untrusted import inside, read_regular

    name = description.get("file", BPE_FILE)
    path = Path(folder) / str(name)
    try:
        raw = read_regular(inside(folder, name, f"{Path(folder) / 'meta.json'}: its tokenizer file"), MAX_BPE_FILE_BYTES, path)
    except FileNotFoundError:
        raise UserError(f"{path} is missing: the dataset's tokenizer is gone; prepare the dataset again")
    if hashlib.sha256(raw).hexdigest() != description.get("sha256"):
        raise UserError(f"{path} does not match the sha256 in meta.json: it was changed; prepare the dataset again")
    return dict(description) | {"json": raw.decode("utf-8")}  # written as ASCII JSON: the check above passed
