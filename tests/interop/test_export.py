"""convert.py --to hf against an independent implementation: transformers' GPT-2 and
LLaMA models and its AutoTokenizer must give our logits and our token ids."""

import json
import subprocess
import sys

import pytest
import torch

import convert
from gptkit.ops.errors import UserError
from gptkit.interop import hf_gpt2, hf_tokenizer
from gptkit.data.tokenizer import CharTokenizer
from model import GPT, GPTConfig
from repo import REPO
from train_helpers import perturbed_model, write_run

transformers = pytest.importorskip("transformers")  # a test-only dependency

CHARS = sorted(set("First Citizen:\nBefore we proceed any further, hear me speak.\nzZqQxX!?;'-&3$"))




def hf_logits(folder, idx):
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        return hf(idx).logits


def our_logits(model, idx):
    with torch.no_grad():
        return model(idx)[0]


def llama_config(**overrides):
    settings = dict(block_size=32, vocab_size=len(CHARS), n_layer=2, n_head=4, n_embd=32, pos_encoding="rope",
                    norm="rmsnorm", mlp="swiglu", bias=False, tie_embeddings=False, rope_theta=500.0)
    return GPTConfig(**{**settings, **overrides})


def test_gpt2_shaped_run_exports_with_equal_logits_and_char_tokenizer(tmp_path):
    model = perturbed_model(GPTConfig(block_size=32, vocab_size=len(CHARS), n_layer=2, n_head=4, n_embd=32,
                                      pad_vocab_multiple=16, mlp="gelu_exact"))
    write_run(tmp_path / "run", model, CharTokenizer(CHARS).to_dict())
    assert convert.main([str(tmp_path / "run"), str(tmp_path / "hf"), "--to", "hf"]) == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "gpt2"
    idx = torch.randint(0, len(CHARS), (2, 32))
    assert (hf_logits(tmp_path / "hf", idx) - our_logits(model, idx)).abs().max().item() < 1e-5
    again = hf_gpt2.load_gpt2(tmp_path / "hf").eval()  # transformers' "gelu" reads back as gelu_exact
    assert again.config.mlp == "gelu_exact"
    assert (our_logits(again, idx) - our_logits(model, idx)).abs().max().item() < 1e-5

    text = "First Citizen:\nBefore we proceed, hear me!\n"
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    ids = hf_tok(text)["input_ids"]
    assert ids == CharTokenizer(CHARS).encode(text)
    assert hf_tok.decode(ids) == text
    assert not list(tmp_path.glob(".hf.tmp-*"))


@pytest.mark.parametrize("tie, n_kv_head, pad", [(False, 2, 1), (True, None, 64)])
def test_llama_shaped_run_exports_as_llama_with_equal_logits(tmp_path, tie, n_kv_head, pad):
    model = perturbed_model(llama_config(tie_embeddings=tie, n_kv_head=n_kv_head, pad_vocab_multiple=pad))
    write_run(tmp_path / "run", model, CharTokenizer(CHARS).to_dict())
    convert.main([str(tmp_path / "run" / "ckpt.pt"), str(tmp_path / "hf"), "--to", "hf"])
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "llama"
    idx = torch.randint(0, len(CHARS), (2, 32))
    assert (hf_logits(tmp_path / "hf", idx) - our_logits(model, idx)).abs().max().item() < 1e-5


def test_gpt2_tokenizer_encodes_as_tiktoken(tmp_path, tiktoken_available, shakespeare_path):
    import tiktoken

    model = perturbed_model(llama_config(vocab_size=50257, n_embd=16, n_head=2, n_layer=1))
    write_run(tmp_path / "run", model, {"type": "gpt2"})
    convert.main([str(tmp_path / "run"), str(tmp_path / "hf"), "--to", "hf"])
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["eos_token_id"] == 50256
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    ours = tiktoken.get_encoding("gpt2")
    assert hf_tok("hello world")["input_ids"] == ours.encode_ordinary("hello world") == [31373, 995]
    text = shakespeare_path.read_text()[:30_000] + " x  \n\n\t y123 4567 ünïcødé 日本語 🙂 it's  end   "
    ids = ours.encode_ordinary(text)
    assert hf_tok(text)["input_ids"] == ids
    assert hf_tok.decode(ids) == text
    # The one difference, as in transformers' own GPT-2: the literal text is the special token.
    assert hf_tok("a<|endoftext|>")["input_ids"] == [64, 50256]


# Unicode (accents, CJK, an emoji split across byte tokens), runs of spaces, tabs and
# newlines, \r\n, a no-break space, digits in long runs, contractions in both cases.
VARIED = (" x  \n\n\t y123 4567 12345678 ünïcødé 日本語 🙂 it's IT'S they'll  end   \r\n"
          " \u00a0 ' 's \n\n\n   ")


@pytest.mark.parametrize("shape", ["gpt2", "llama"])
def test_our_trained_bpe_exports_with_its_tokenizer_and_gives_our_ids_and_text(tmp_path, shakespeare_path, shape):
    """prepare.py --tokenizer bpe's tokenizer: AutoTokenizer (and PreTrainedTokenizerFast on
    the bare tokenizer.json) give tiktoken's ids and text back, <|endoftext|> at our id."""
    from gptkit.prepare.bpe import train_bpe

    text = shakespeare_path.read_text()
    ours = train_bpe(iter([text[:200_000]]), 1024)
    config = (GPTConfig(block_size=32, vocab_size=ours.vocab_size, n_layer=1, n_head=2, n_embd=16)
              if shape == "gpt2" else llama_config(vocab_size=ours.vocab_size, n_embd=16, n_head=2, n_layer=1))
    model = perturbed_model(config)
    write_run(tmp_path / "run", model, ours.to_dict())
    assert convert.main([str(tmp_path / "run"), str(tmp_path / "hf"), "--to", "hf"]) == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["eos_token_id"] == ours.eot_id == 1023
    idx = torch.randint(0, ours.vocab_size, (2, 32))
    assert (hf_logits(tmp_path / "hf", idx) - our_logits(model, idx)).abs().max().item() < 1e-5

    sample = text[200_000:230_000] + VARIED  # text the BPE never saw, then the odd cases
    ids = ours.encode(sample)
    for hf_tok in (transformers.AutoTokenizer.from_pretrained(tmp_path / "hf"),
                   transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "hf" / "tokenizer.json"))):
        assert hf_tok(sample)["input_ids"] == ids
        assert hf_tok.decode(ids) == sample
        assert hf_tok(VARIED)["input_ids"] == ours.encode(VARIED)
        assert hf_tok.convert_tokens_to_ids("<|endoftext|>") == ours.eot_id
        assert hf_tok.decode([ours.eot_id]) == "<|endoftext|>"


def test_architectures_that_map_nowhere_are_named_and_nothing_is_written(tmp_path):
    model = GPT(llama_config(qk_norm=True, logit_softcap=30.0))
    write_run(tmp_path / "run", model, CharTokenizer(CHARS).to_dict())
    with pytest.raises(UserError) as info:
        convert.main([str(tmp_path / "run"), str(tmp_path / "hf"), "--to", "hf"])
    message = str(info.value)
    assert "qk_norm=True" in message and "logit_softcap=30.0" in message and "LLaMA" in message
    assert not (tmp_path / "hf").exists() and not list(tmp_path.glob(".hf*"))
    assert "Models that export: " in message and "configs/shakespeare_llama.py" in message


def test_the_configs_the_refusal_points_to_do_export():
    """Every config the refusal names builds a model that maps onto an architecture we export."""
    import dataclasses
    import re
    import runpy

    from gptkit.interop.export import EXPORTING_CONFIGS, hf_architecture

    named = re.findall(r"configs/\w+\.py", EXPORTING_CONFIGS)
    assert len(named) == 2
    fields = {f.name for f in dataclasses.fields(GPTConfig)}
    for path in named:
        settings = {k: v for k, v in runpy.run_path(str(REPO / path)).items() if k in fields}
        settings.setdefault("vocab_size", 65)
        assert hf_architecture(GPTConfig(**settings)) in ("gpt2", "llama"), path


def test_unknown_tokenizer_type_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match="'sentencepiece' tokenizer .* not supported yet"):
        hf_tokenizer.write_tokenizer({"type": "sentencepiece"}, tmp_path, 64)


def test_command_line_errors_exit_2_without_traceback(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    cases = [
        [str(tmp_path / "missing"), str(tmp_path / "hf"), "--to", "hf"],
        [str(tmp_path), str(tmp_path / "full"), "--to", "hf"],
        [str(tmp_path), str(tmp_path / "hf"), "--to", "onnx"],
    ]
    for argv in cases:
        result = subprocess.run([sys.executable, "convert.py", *argv], cwd=REPO, capture_output=True, text=True)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("error: ") and "Traceback" not in result.stderr
