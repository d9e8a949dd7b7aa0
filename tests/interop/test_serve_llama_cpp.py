"""Our chat template in llama.cpp, and our GGUF served by llama-cpp-python's own
OpenAI-compatible server against serve.py.

llama.cpp renders a chat two ways: with Jinja (the GGUF's tokenizer.chat_template: our
ids exactly, as transformers' apply_chat_template) or, without it, with a built-in
layout it picks by looking for marker strings in the template. Ours contains
<|assistant|> and <|end|>, which it reads as Phi-3's, whose layout puts a newline after
every marker; no built-in layout is ours, so llama.cpp needs Jinja (docs/chat.md says
which flag). The tests pin both facts: if llama.cpp's detection changes, they say so."""

import socket
import subprocess
import sys
import time

import pytest
from serve_helpers import Server, get, post, write_checkpoint
from train_helpers import perturbed_model, write_run

import convert
from gptkit.data.chat import CHAT_TEMPLATE, prompt_ids
from gptkit.data.tokenizer import CharTokenizer
from model import GPTConfig

llama_cpp = pytest.importorskip("llama_cpp")
transformers = pytest.importorskip("transformers")

CHARS = sorted(set("abcdefghijklmnopqrstuvwxyz ?.,\n"))
CONVERSATIONS = [
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello."}, {"role": "user", "content": "and?"}],
    [{"role": "system", "content": "be brief."}, {"role": "user", "content": "hi"},
     {"role": "assistant", "content": "hello."}, {"role": "user", "content": "and now?"}],
]


def builtin_rendering(template, messages):
    """llama.cpp's rendering without Jinja: llama_chat_apply_template, the C function
    llama-cli and llama-server call when --jinja is off."""
    import ctypes

    chat = (llama_cpp.llama_chat_message * len(messages))(
        *[llama_cpp.llama_chat_message(role=m["role"].encode(), content=m["content"].encode()) for m in messages])
    buffer = ctypes.create_string_buffer(8192)
    n = llama_cpp.llama_chat_apply_template(template.encode(), chat, len(messages), True, buffer, len(buffer))
    assert 0 < n <= len(buffer), n
    return buffer.raw[:n].decode()


def test_our_ids_equal_transformers_and_llama_cpp_with_jinja_and_not_its_builtin_phi3_layout(tmp_path):
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    tok = CharTokenizer(CHARS)
    config = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=64, vocab_size=tok.vocab_size + 4)
    run = write_run(tmp_path / "run", perturbed_model(config), tok.to_dict())
    assert convert.main([str(run), str(tmp_path / "chat.gguf"), "--to", "gguf", "--outtype", "f32"]) == 0
    assert convert.main([str(run), str(tmp_path / "hf"), "--to", "hf"]) == 0
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    llm = llama_cpp.Llama(model_path=str(tmp_path / "chat.gguf"), n_ctx=64, vocab_only=True, verbose=False)
    jinja = Jinja2ChatFormatter(template=llm.metadata["tokenizer.chat_template"], eos_token="<|end|>", bos_token="")
    for messages in CONVERSATIONS:
        ours = prompt_ids(messages, tok.encode, tok.vocab_size)
        result = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        assert list(result["input_ids"] if hasattr(result, "keys") else result) == ours
        assert llm.tokenize(jinja(messages=messages).prompt.encode(), add_bos=False, special=True) == ours
        # Without Jinja: Phi-3's layout, a newline after each marker, which our model never saw
        text = builtin_rendering(CHAT_TEMPLATE, messages)
        phi3 = "".join(f"<|{m['role']}|>\n{m['content']}<|end|>\n" for m in messages) + "<|assistant|>\n"
        assert text == phi3
        assert llm.tokenize(text.encode(), add_bos=False, special=True) != ours


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_llama_cpp_pythons_server_gives_serve_pys_first_reply(tmp_path):
    pytest.importorskip("llama_cpp.server.app", reason="llama-cpp-python's server extra is not installed")
    ckpt = write_checkpoint(tmp_path / "chat.pt", seed=3)
    run = tmp_path / "run"
    run.mkdir()
    ckpt.rename(run / "ckpt.pt")
    assert convert.main([str(run), str(tmp_path / "chat.gguf"), "--to", "gguf", "--outtype", "f32"]) == 0
    port = free_port()
    theirs = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(tmp_path / "chat.gguf"),
                               "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "64", "--verbose", "false"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ours = Server(f"--out_dir={run}")
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and theirs.poll() is None:
            try:
                if get(url + "/v1/models", timeout=2)[0] == 200:
                    break
            except OSError:
                time.sleep(0.2)
        assert theirs.poll() is None, theirs.stderr.read()
        first = [[{"role": "user", "content": "hi there"}],
                 [{"role": "system", "content": "be brief."}, {"role": "user", "content": "hi"},
                  {"role": "assistant", "content": "hello."}, {"role": "user", "content": "and now"}]]
        for messages in first:
            # llama-cpp-python's server applies repeat_penalty 1.1 unless told: none, as ours
            body = {"messages": messages, "temperature": 0, "max_tokens": 12, "repeat_penalty": 1.0}
            mine = post(ours.url + "/v1/chat/completions", body)
            other = post(url + "/v1/chat/completions", body)
            assert mine[0] == 200 and other[0] == 200, (mine, other)
            text = mine[1]["choices"][0]["message"]["content"]
            assert other[1]["choices"][0]["message"]["content"] == text and text
    finally:
        theirs.terminate()
        theirs.wait(timeout=30)
        ours.stop()
