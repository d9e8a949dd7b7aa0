"""Tool calls in the chat template (gptkit/data/chat.py): their tokens, their mask, the checks of
a conversation that calls the calculator, and a prepared dataset that holds them."""

import json

import pytest

from gptkit.data.chat import (CHAT_TEMPLATE, chat_vocabulary, encode_conversation, parse_line, prompt_ids,
                         special_ids, tool_ids, turn_ids)
from gptkit.ops.errors import UserError
from gptkit.data.tokenizer import CharTokenizer

CHARS = CharTokenizer(sorted(set("abcdefghijklmnopqrstuvwxyz ?0123456789*+-/()")))
BASE = CHARS.vocab_size


def call(expression, as_string=True):
    arguments = {"expression": expression}
    return {"type": "function", "function": {"name": "calculator",
                                             "arguments": json.dumps(arguments) if as_string else arguments}}


def tool_conversation(as_string=True):
    return [{"role": "user", "content": "what is 12*34?"},
            {"role": "assistant", "content": "so", "tool_calls": [call("12*34", as_string)]},
            {"role": "tool", "content": "408"},
            {"role": "assistant", "content": "it is 408"},
            {"role": "user", "content": "and 2+2?"},
            {"role": "assistant", "content": "4"}]


def test_a_call_is_learned_and_its_output_is_not():
    ids, mask = encode_conversation(tool_conversation(), CHARS.encode, BASE)
    s, enc = special_ids(BASE, tools=True), CHARS.encode
    expected = [(s["<|user|>"], 0), *[(t, 0) for t in enc("what is 12*34?")], (s["<|end|>"], 0),
                (s["<|assistant|>"], 0), *[(t, 1) for t in enc("so")],
                (s["<|call|>"], 1), *[(t, 1) for t in enc("12*34")], (s["<|/call|>"], 1),
                (s["<|output|>"], 0), *[(t, 0) for t in enc("408")], (s["<|/output|>"], 0),
                *[(t, 1) for t in enc("it is 408")], (s["<|end|>"], 1),  # the same turn goes on
                (s["<|user|>"], 0), *[(t, 0) for t in enc("and 2+2?")], (s["<|end|>"], 0),
                (s["<|assistant|>"], 0), (enc("4")[0], 1), (s["<|end|>"], 1)]
    assert list(zip(ids, mask)) == expected
    # the arguments as an object (transformers' form) or a JSON string (OpenAI's) are the same tokens
    assert encode_conversation(tool_conversation(as_string=False), CHARS.encode, BASE) == (ids, mask)


def test_tool_ids_follow_the_turn_ids_and_only_a_model_with_them_has_them():
    assert list(tool_ids(BASE).values()) == list(range(BASE + 4, BASE + 8))
    assert chat_vocabulary(BASE + 4, BASE) == turn_ids(BASE)
    assert chat_vocabulary(BASE + 8, BASE) == turn_ids(BASE) | tool_ids(BASE)
    assert chat_vocabulary(BASE + 5, BASE) is None and chat_vocabulary(BASE, BASE) is None


def test_the_jinja_template_renders_a_tool_conversation_as_our_ids():
    jinja2 = pytest.importorskip("jinja2")
    from jinja2.sandbox import ImmutableSandboxedEnvironment  # as transformers and llama-cpp-python render

    template = ImmutableSandboxedEnvironment().from_string(CHAT_TEMPLATE)
    names = {v: k for k, v in special_ids(BASE, tools=True).items()}
    messages = tool_conversation(as_string=False)
    for prompt, generation in ((messages, False), (messages[:5], True)):
        text = template.render(messages=prompt, add_generation_prompt=generation)
        ours = prompt_ids(prompt, CHARS.encode, BASE) if generation else encode_conversation(prompt, CHARS.encode, BASE)[0]
        assert text == "".join(names.get(i) or CHARS.decode([i]) for i in ours)
    assert jinja2


GOOD_CALL = {"role": "assistant", "content": None, "tool_calls": [call("1+1")]}


@pytest.mark.parametrize("messages, words", [
    ([{"role": "user", "content": "a"}, {"role": "tool", "content": "2"}, {"role": "assistant", "content": "b"}],
     "no assistant tool call before it"),
    ([{"role": "user", "content": "a"}, GOOD_CALL, {"role": "assistant", "content": "b"}], "come their outputs"),
    ([{"role": "user", "content": "a"}, GOOD_CALL, {"role": "tool", "content": "2"}], "ends inside a tool call"),
    ([{"role": "user", "content": "a"}, GOOD_CALL, {"role": "tool", "content": "2"}, {"role": "user", "content": "b"}],
     "come their outputs"),
    ([{"role": "user", "content": "a", "tool_calls": [call("1")]}, {"role": "assistant", "content": "b"}],
     "only an assistant message"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "python", "arguments": "{}"}}]}], "only tool is the calculator"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "calculator", "arguments": "{\"expr\": 1"}}]}], "arguments must be"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "", "tool_calls": []}], "non-empty list"),
])
def test_a_misplaced_or_malformed_call_is_one_line(messages, words):
    with pytest.raises(UserError) as e:
        parse_line(json.dumps({"messages": messages}).encode())
    assert words in str(e.value) and "\n" not in str(e.value)


def test_a_call_with_no_content_reads_as_empty_content():
    messages = parse_line(json.dumps({"messages": [{"role": "user", "content": "a"}, GOOD_CALL,
                                                   {"role": "tool", "content": "2"},
                                                   {"role": "assistant", "content": "2"}]}).encode())
    assert messages[1]["content"] == "" and GOOD_CALL["content"] is None  # the caller's dict is left as it was


def test_a_dataset_with_calls_has_the_tool_tokens_and_one_without_has_not(tmp_path):
    from gptkit.data.dataset import load_meta
    from gptkit.prepare.chat import prepare_chat

    plain = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    for name, conversations in (("tools", [tool_conversation(), plain] * 5), ("plain", [plain] * 10)):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in conversations))
        prepare_chat([path], "char", name, tmp_path, progress=False)
    tools, plain_meta = load_meta(tmp_path, "tools"), load_meta(tmp_path, "plain")
    base = tools["vocab_size"] - 8
    assert tools["chat"]["tool_ids"] == tool_ids(base) and "*" in tools["tokenizer"]["chars"]  # the call's text too
    assert "tool_ids" not in plain_meta["chat"] and plain_meta["vocab_size"] == len(plain_meta["tokenizer"]["chars"]) + 4


def test_a_chat_model_without_tool_tokens_grows_by_them_to_learn_calls(tmp_path):
    import train
    from gptkit.ops.checkpoint import load_checkpoint
    from train_helpers import tiny_args

    plain = [{"role": "user", "content": "what is 12*34?"}, {"role": "assistant", "content": "so it is 408"},
             {"role": "user", "content": "and 2+2?"}, {"role": "assistant", "content": "4"}]
    for name, conversations in (("plain", [plain] * 10), ("tools", [tool_conversation()] * 10)):
        path = tmp_path / f"{name}.jsonl"  # the same characters in both: the same tokenizer
        path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in conversations))
        from gptkit.prepare.chat import prepare_chat

        prepare_chat([path], "char", name, tmp_path / "data", progress=False)
    settings = dict(block_size=64, max_iters=2, eval_iters=0, dropout=0.0)
    assert train.main(tiny_args(tmp_path / "data", tmp_path / "a", dataset="plain", **settings)) == 0
    before = load_checkpoint(tmp_path / "a" / "ckpt.pt")
    base = before["model_config"]["vocab_size"] - 4
    assert train.main(tiny_args(tmp_path / "data", tmp_path / "b", dataset="tools", init_from=str(tmp_path / "a"),
                                **settings)) == 0
    after = load_checkpoint(tmp_path / "b" / "ckpt.pt")
    assert after["model_config"]["vocab_size"] == base + 8
    assert chat_vocabulary(after["model_config"]["vocab_size"], base) == special_ids(base, tools=True)


def test_a_generated_reply_reads_back_as_the_messages_that_encode_to_its_tokens():
    from gptkit.data.chat import calculator_call, marked_reply_messages

    def assistant(content, *expressions):
        return {"role": "assistant", "content": content,
                **({"tool_calls": [calculator_call(e) for e in expressions]} if expressions else {})}

    def tool(content):
        return {"role": "tool", "content": content}

    two_calls = "a<|call|>1+1<|/call|><|output|>2<|/output|>b<|call|>3<|/call|><|output|>3<|/output|>c"
    messages = marked_reply_messages(two_calls, BASE)
    assert messages == [assistant("a", "1+1"), tool("2"), assistant("b", "3"), tool("3"), assistant("c")]
    ids, _ = encode_conversation([{"role": "user", "content": "x"}] + messages, CHARS.encode, BASE)
    s = special_ids(BASE, tools=True)
    marker = {v: k for k, v in s.items()}
    assert "".join(marker.get(i) or CHARS.decode([i]) for i in ids) == "<|user|>x<|end|><|assistant|>" + two_calls + "<|end|>"
    # what is not well formed is kept as far as it went
    assert marked_reply_messages("a<|call|>1+", BASE) == [assistant("a1+")]  # a call never closed: text
    assert marked_reply_messages("<|call|>1<|/call|>", BASE) == [assistant("", "1"), tool(""), assistant("")]
    assert marked_reply_messages("<|output|>5<|/output|>x", BASE) == [assistant("5x")]  # an output nobody asked for
    assert marked_reply_messages("plain <|end|> text", BASE) == [assistant("plain <|end|> text")]  # not a tool marker
