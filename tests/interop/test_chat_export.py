"""A chat model's exports carry its template: transformers' apply_chat_template and
llama.cpp's chat formatting (llama-cpp-python) give exactly our prompt ids, with the
turn tokens (and a tool model's tool tokens) as special tokens at our ids."""

import pytest
from train_helpers import perturbed_model, write_run

import convert
from gptkit.data.chat import CHAT_TEMPLATE, chat_vocabulary, encode_conversation, prompt_ids, turn_ids
from gptkit.data.tokenizer import CharTokenizer, GPT2Tokenizer
from model import GPTConfig

transformers = pytest.importorskip("transformers")

CHARS = sorted(set("abcdefghijklmnopqrstuvwxyz ABC?!.,'0123456789+*/=\né<|>"))
CONVERSATIONS = [
    [{"role": "user", "content": "what is 2+3?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
     {"role": "assistant", "content": "hello, it's me."}, {"role": "user", "content": "and now?\né"}],
    [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y z"}],
]
CALL = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "12*34"}}}
TOOL_CONVERSATIONS = [  # for a model with the tool tokens (the arguments as an object, transformers' form)
    [{"role": "user", "content": "what is 12*34?"}, {"role": "assistant", "content": "", "tool_calls": [CALL]},
     {"role": "tool", "content": "408"}, {"role": "assistant", "content": "408."}, {"role": "user", "content": "ok"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "tool_calls": [CALL, CALL]},
     {"role": "tool", "content": "408"}, {"role": "tool", "content": "error, no 1/0"},
     {"role": "assistant", "content": "c"}],
]


def chat_run(tmp_path, tokenizer, specials=4):
    """A run folder holding a GPT-2-shaped chat model: the tokenizer's ids, then the 4 turn
    tokens (and the 4 tool tokens with specials=8)."""
    config = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=64, vocab_size=tokenizer.vocab_size + specials)
    return write_run(tmp_path / "run", perturbed_model(config), tokenizer.to_dict())


def hf_ids(result):
    return list(result["input_ids"] if hasattr(result, "keys") else result)  # a dict in newer transformers


def trained_bpe():
    """A BPE trained as prepare.py --tokenizer bpe trains one, on text the conversations share."""
    from gptkit.prepare.bpe import train_bpe

    return train_bpe(iter([" ".join(m["content"] for c in CONVERSATIONS for m in c) * 30]), 280)


@pytest.mark.parametrize("kind, specials", [("char", 4), ("char", 8), ("gpt2", 8), ("bpe", 8)])
def test_apply_chat_template_gives_our_prompt_ids(tmp_path, kind, specials, request):
    if kind == "gpt2":
        request.getfixturevalue("tiktoken_available")
    tok = {"char": lambda: CharTokenizer(CHARS), "gpt2": GPT2Tokenizer, "bpe": trained_bpe}[kind]()
    assert convert.main([str(chat_run(tmp_path, tok, specials)), str(tmp_path / "hf"), "--to", "hf"]) == 0
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    turns = chat_vocabulary(tok.vocab_size + specials, tok.vocab_size)
    assert len(turns) == specials and {name: hf.convert_tokens_to_ids(name) for name in turns} == turns
    for messages in CONVERSATIONS + (TOOL_CONVERSATIONS if specials == 8 else []):
        ours = prompt_ids(messages, tok.encode, tok.vocab_size)
        assert hf_ids(hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)) == ours
        whole = encode_conversation(messages, tok.encode, tok.vocab_size)[0]
        assert hf_ids(hf.apply_chat_template(messages, tokenize=True)) == whole


def test_a_plain_model_exports_no_template(tmp_path):
    tok = CharTokenizer(CHARS)
    config = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=64, vocab_size=tok.vocab_size)
    assert convert.main([str(write_run(tmp_path / "run", perturbed_model(config), tok.to_dict())), str(tmp_path / "hf"), "--to", "hf"]) == 0
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "hf").chat_template is None


@pytest.mark.parametrize("kind", ["char", "gpt2"])
def test_llama_cpp_formats_a_conversation_to_our_prompt_ids(tmp_path, kind, request):  # a model with tool tokens
    llama_cpp = pytest.importorskip("llama_cpp")
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    if kind == "gpt2":
        request.getfixturevalue("tiktoken_available")
    tok = CharTokenizer(CHARS) if kind == "char" else GPT2Tokenizer()
    dest = tmp_path / "chat.gguf"
    assert convert.main([str(chat_run(tmp_path, tok, specials=8)), str(dest), "--to", "gguf", "--outtype", "f32"]) == 0
    llm = llama_cpp.Llama(model_path=str(dest), n_ctx=64, vocab_only=True, verbose=False)
    assert llm.metadata["tokenizer.chat_template"] == CHAT_TEMPLATE
    turns = turn_ids(tok.vocab_size)
    assert llm.token_eos() == turns["<|end|>"]
    formatter = Jinja2ChatFormatter(template=CHAT_TEMPLATE, eos_token="<|end|>", bos_token="")
    for messages in CONVERSATIONS + TOOL_CONVERSATIONS:
        prompt = formatter(messages=messages).prompt  # what create_chat_completion tokenizes
        assert llm.tokenize(prompt.encode(), add_bos=False, special=True) == prompt_ids(messages, tok.encode, tok.vocab_size)
