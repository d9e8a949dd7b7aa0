"""Our tokenizers written as Hugging Face tokenizer files, so that
`transformers.AutoTokenizer.from_pretrained(folder)` encodes exactly as we do.

    GPT-2 BPE   vocab.json + merges.txt (GPT-2's own format), rebuilt from tiktoken's ranks
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
from gptkit.data.tokenizer import GPT2_EOT_ID, load_gpt2_encoding

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


def write_char_tokenizer(folder, chars, model_max_length, turns=None):
    """tokenizer.json where id i is chars[i]: a BPE model with no merges reads text one
    character at a time, with no normalizer and no pre-tokenizer to change it. A chat
    model's turn tokens follow as special added tokens (ids len(chars) on)."""
    try:
        from tokenizers import AddedToken, Tokenizer, decoders, models
    except ImportError:
        raise UserError("exporting a character-level tokenizer needs the tokenizers package: pip install tokenizers")
    tokenizer = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(chars)}, merges=[]))
    tokenizer.decoder = decoders.Fuse()  # decode joins characters as they are, no spaces between
    if turns is not None:
        tokenizer.add_special_tokens([AddedToken(name, normalized=False, special=True) for name in turns])
        assert [tokenizer.token_to_id(name) for name in turns] == list(turns.values()), "turn tokens not at their ids"
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
    raise UserError(
        f"exporting a {kind!r} tokenizer to Hugging Face is not supported yet (only gpt2 and char are; "
        "a writer for it goes in gptkit/interop/hf_tokenizer.py: write_tokenizer)"
    )
