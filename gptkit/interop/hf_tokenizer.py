"""Our tokenizers written as Hugging Face tokenizer files, so that
`transformers.AutoTokenizer.from_pretrained(folder)` encodes exactly as we do.

    GPT-2 BPE   vocab.json + merges.txt (GPT-2's own format), rebuilt from tiktoken's ranks
    our BPE     tokenizer.json: GPT-2's byte-level pre-tokenizer and byte alphabet, our
                tokens and the merges recovered from their order (needs `tokenizers`)
    char        tokenizer.json: one token per character, no merges (needs `tokenizers`,
                which comes with transformers)
    chat model  the four turn tokens as special added tokens, and tokenizer_config.json's
                chat_template, so that apply_chat_template gives our prompt ids

    python convert.py out-shakespeare hf-shakespeare --to hf

A tokenizer type not handled here is an error naming it (write_tokenizer), never a
folder that silently tokenizes differently.
"""

import json
from pathlib import Path

from gptkit.ops.errors import UserError
from gptkit.data.tokenizer import GPT2_EOT_ID, load_gpt2_encoding, tokenizer_from_dict

EOT = "<|endoftext|>"


def byte_symbols():
    """GPT-2's printable stand-in for each byte 0..255 (the byte-level BPE alphabet):
    printable Latin-1 bytes stand for themselves, the other 68 (controls, space, ...)
    get the characters from U+0100 on, in byte order (Radford et al. 2019's encoder.py
    convention, which vocab.json and merges.txt are written in)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols, extra = {}, 0
    for b in range(256):
        if b in printable:
            symbols[b] = chr(b)
        else:
            symbols[b] = chr(256 + extra)
            extra += 1
    return symbols


def bpe_merges(ranks):
    """[(left, right) bytes] in rank order, recovered from tiktoken's {token bytes: rank}.

    A token of rank r was made by the merge of rank r: running BPE on its bytes with only
    the merges ranked below r stops at exactly two parts, and those two are the merge."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) < 2:
            continue
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:
            pair_ranks = [ranks.get(parts[i] + parts[i + 1], rank) for i in range(len(parts) - 1)]
            best = min(range(len(pair_ranks)), key=pair_ranks.__getitem__)
            if pair_ranks[best] >= rank:
                break
            parts[best : best + 2] = [parts[best] + parts[best + 1]]
        assert len(parts) == 2, f"token {token!r} (rank {rank}) is not one merge of two tokens"
        merges.append((parts[0], parts[1]))
    return merges


def chat_settings(turns):
    """tokenizer_config.json's part for a chat model: the turn tokens as special added
    tokens at their ids, and the chat template (gptkit/data/chat.py)."""
    if turns is None:
        return {}
    from gptkit.data.chat import CHAT_TEMPLATE

    added = {str(i): {"content": name, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                      "special": True} for name, i in turns.items()}
    return {"added_tokens_decoder": added, "additional_special_tokens": list(turns), "chat_template": CHAT_TEMPLATE}


def write_gpt2_tokenizer(folder, model_max_length, turns=None):
    """vocab.json, merges.txt and tokenizer_config.json for transformers' GPT2Tokenizer."""
    encoding = load_gpt2_encoding()
    ranks = encoding._mergeable_ranks  # {token bytes: id}; tiktoken keeps no public accessor
    symbols = byte_symbols()

    def text(token):
        return "".join(symbols[b] for b in token)

    vocab = {text(token): rank for token, rank in ranks.items()}
    vocab[EOT] = GPT2_EOT_ID
    merges = ["#version: 0.2"] + [f"{text(a)} {text(b)}" for a, b in bpe_merges(ranks)]
    folder = Path(folder)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (folder / "merges.txt").write_text("\n".join(merges) + "\n", encoding="utf-8")
    _write_config(folder, {
        "tokenizer_class": "GPT2Tokenizer", "model_max_length": model_max_length,
        "bos_token": EOT, "eos_token": EOT, "unk_token": EOT, "add_prefix_space": False,
        "add_bos_token": False,
    } | chat_settings(turns))


def _tokenizers_package(what):
    try:
        import tokenizers
    except ImportError:
        raise UserError(f"exporting a {what} tokenizer needs the tokenizers package: pip install tokenizers")
    return tokenizers


def _add_turns(tokenizer, turns):
    """A chat model's turn tokens as special added tokens, checked to land at our ids."""
    from tokenizers import AddedToken

    if turns is not None:
        tokenizer.add_special_tokens([AddedToken(name, normalized=False, special=True) for name in turns])
        assert [tokenizer.token_to_id(name) for name in turns] == list(turns.values()), "turn tokens not at their ids"


def write_bpe_tokenizer(folder, bpe, model_max_length, turns=None):
    """tokenizer.json for a BPE trained by prepare.py (a BPETokenizer): the same byte-level
    scheme as GPT-2's (its pre-tokenizer pattern, which ours is, and its byte symbols), our
    tokens as the vocabulary, the merges recovered from their order, and <|endoftext|> and
    a chat model's turn tokens as special tokens at our ids.

    ignore_merges: a piece that is a whole token is that token, as tiktoken encodes it,
    without replaying the merges that built it."""
    tokenizers = _tokenizers_package("BPE")
    from tokenizers import AddedToken, decoders, models, pre_tokenizers

    symbols = byte_symbols()

    def spell(token):
        return "".join(symbols[b] for b in token)

    ranks = {token: i for i, token in enumerate(bpe.token_bytes)}
    vocab = {spell(token): i for token, i in ranks.items()}
    merges = [(spell(a), spell(b)) for a, b in bpe_merges(ranks)]
    tokenizer = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(EOT, normalized=False, special=True)])
    assert tokenizer.token_to_id(EOT) == bpe.eot_id, "<|endoftext|> not at its id"
    _add_turns(tokenizer, turns)
    tokenizer.save(str(Path(folder) / "tokenizer.json"))
    _write_config(Path(folder), {
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model_max_length,
        "bos_token": EOT, "eos_token": EOT, "add_prefix_space": False,
    } | chat_settings(turns))


def write_char_tokenizer(folder, chars, model_max_length, turns=None):
    """tokenizer.json where id i is chars[i]: a BPE model with no merges reads text one
    character at a time, with no normalizer and no pre-tokenizer to change it. A chat
    model's turn tokens follow as special added tokens (ids len(chars) on)."""
    tokenizers = _tokenizers_package("character-level")
    from tokenizers import decoders, models

    tokenizer = tokenizers.Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(chars)}, merges=[]))
    tokenizer.decoder = decoders.Fuse()  # decode joins characters as they are, no spaces between
    _add_turns(tokenizer, turns)
    tokenizer.save(str(Path(folder) / "tokenizer.json"))
    _write_config(Path(folder), {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model_max_length}
                  | chat_settings(turns))


def _write_config(folder, settings):
    # clean_up_tokenization_spaces would rewrite " ." as "." when decoding: never ours
    settings = {**settings, "clean_up_tokenization_spaces": False}
    (folder / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n")


def write_tokenizer(tokenizer_dict, folder, model_max_length, turns=None):
    """Write the tokenizer a checkpoint describes (its meta.json form) into `folder`, with
    a chat model's `turns` ({name: id}, gptkit/data/chat.py) and template; returns the
    end-of-text id or None. A new tokenizer type needs its writer here."""
    kind = tokenizer_dict.get("type") if isinstance(tokenizer_dict, dict) else None
    if kind == "gpt2":
        write_gpt2_tokenizer(folder, model_max_length, turns)
        return GPT2_EOT_ID
    if kind == "char":
        write_char_tokenizer(folder, tokenizer_dict["chars"], model_max_length, turns)
        return None
    if kind == "bpe":
        bpe = tokenizer_from_dict(tokenizer_dict)  # checks the embedded tokenizer against its sha256
        write_bpe_tokenizer(folder, bpe, model_max_length, turns)
        return bpe.eot_id
    raise UserError(
        f"exporting a {kind!r} tokenizer to Hugging Face is not supported yet (only gpt2, bpe and char are; "
        "a writer for it goes in gptkit/interop/hf_tokenizer.py: write_tokenizer)"
    )
