"""tokenizer.py: the two tokenizers, rebuilt from their meta.json description."""

import json

import pytest

from gptkit.ops.errors import UserError
from gptkit.data.tokenizer import CharTokenizer, GPT2Tokenizer, Tokenizer, tokenizer_from_dict


def test_char_round_trip_and_description():
    tok = CharTokenizer(sorted(set("hello world\n")))  # "\n", " ", "d", "e", "h", "l", "o", "r", "w"
    ids = tok.encode("hello world\n")
    assert ids == [4, 3, 5, 5, 6, 1, 8, 6, 7, 5, 2, 0]
    assert tok.decode(ids) == "hello world\n"
    assert tok.vocab_size == 9 and tok.eot_id is None
    again = Tokenizer.from_dict(json.loads(json.dumps(tok.to_dict())))  # through meta.json
    assert again.encode("world") == tok.encode("world")


def test_char_unknown_characters_are_named():
    tok = CharTokenizer("abc")
    with pytest.raises(UserError, match=r"2 character\(s\) outside .*'x', 'z'"):
        tok.encode("abzx")


def test_gpt2_known_ids(tiktoken_available):
    tok = tokenizer_from_dict({"type": "gpt2"})
    assert isinstance(tok, GPT2Tokenizer)
    assert tok.encode("Hello world") == [15496, 995]  # GPT-2's published ids
    assert tok.encode("<|endoftext|>") != [50256]  # ordinary text, never the special token
    assert tok.decode([15496, 995, 50256]) == "Hello world<|endoftext|>"
    assert tok.vocab_size == 50257 and tok.eot_id == 50256
    assert tok.to_dict() == {"type": "gpt2"}


@pytest.mark.parametrize("bad", [{"type": "sentencepiece"}, {}, "char", None])
def test_unknown_description(bad):
    with pytest.raises(UserError, match="unknown tokenizer description"):
        tokenizer_from_dict(bad)
