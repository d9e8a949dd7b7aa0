"""sample.py --chat as users meet it (gptkit/generation/chat_session.py): a Windows file piped in, a
line that is not UTF-8, a message too long for the context in a terminal session."""

import dataclasses
import io

import pytest
import torch

from gptkit.generation.chat_session import Session, reply, talk
from gptkit.ops.errors import UserError
from gptkit.data.tokenizer import CharTokenizer
from model import GPT, GPTConfig
from sample import SampleConfig

TOK = CharTokenizer(sorted(set("abcdefghij ?")))


def session(block_size=64):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=block_size, vocab_size=TOK.vocab_size + 4)).eval()
    return Session(model, TOK)


CFG = dataclasses.replace(SampleConfig(), max_new_tokens=4, temperature=0.0, device="cpu", cpu_decode=False)


def piped(data):
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", newline="\n")  # as sys.stdin on POSIX


def test_a_windows_file_piped_in_is_read_without_its_carriage_returns():
    # CRLF lines failed on "\r", a character outside the vocabulary.
    s, out = session(), []
    assert talk(s, CFG, "cpu", piped(b"abc?\r\nde f\r\n"), out.append) == 0
    assert [m["content"] for m in s.history if m["role"] == "user"] == ["abc?", "de f"]
    assert out.count("\n") == 2


def test_a_line_that_is_not_utf8_is_one_line_naming_it():
    # It was a UnicodeDecodeError traceback.
    s = session()
    with pytest.raises(UserError, match=r"^standard input, line 2: not UTF-8 text \(invalid start byte at byte 2\)$"):
        talk(s, CFG, "cpu", piped(b"abc\na\xffb\n"), lambda text: None)
    assert [m["content"] for m in s.history if m["role"] == "user"] == ["abc"]


def test_a_message_too_long_for_the_context_keeps_the_history():
    # The refused message had already dropped every older turn: the whole history was wiped
    # though the session says the conversation goes on.
    s = session(block_size=32)
    s.history = [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "cd"},
                 {"role": "user", "content": "ef"}, {"role": "assistant", "content": "gh"}]
    before = [dict(m) for m in s.history]
    with pytest.raises(UserError, match="more than the model's context of 32: write a shorter one"):
        reply(s, "a" * 40, CFG, "cpu")
    assert s.history == before
    reply(s, "ij", CFG, "cpu")  # and it goes on from there
    assert [m["content"] for m in s.history[:4]] == ["ab", "cd", "ef", "gh"] and s.history[4]["content"] == "ij"
