"""convert.py --to gguf: the file's structure read back with the gguf package's own
reader, and the model run by llama.cpp itself (through llama-cpp-python), which must
give our token ids and our logits."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import convert
from gptkit.ops.errors import UserError
from gptkit.interop.gguf_export import rotary_to_neighbour_pairs
from gptkit.interop.hf_tokenizer import byte_symbols
from gptkit.data.tokenizer import CharTokenizer, GPT2Tokenizer
from model import GPT, GPTConfig, apply_rope, rope_angles
from repo import REPO
from train_helpers import perturbed_model, write_run

gguf = pytest.importorskip("gguf")  # in requirements.txt: convert.py --to gguf needs it

try:
    import llama_cpp
except ImportError:
    llama_cpp = None
needs_llama_cpp = pytest.mark.skipif(
    llama_cpp is None, reason="llama.cpp comparisons need llama-cpp-python: pip install -r requirements-gguf.txt"
)

CHARS = sorted(set("First Citizen:\nBefore we proceed any further, hear me speak.\nzZqQxX!?;'-&3$"))
WIDE_CHARS = sorted(set(CHARS) | set("éü—“”日本🙂"))  # 2, 3 and 4 UTF-8 bytes
TEXT_60 = "First Citizen:\nBefore we proceed any further, hear me speak.\n"[:60]




GGML_TYPE_F32 = 0  # ggml's type id for float32 (llama.cpp's type_k / type_v)


def export(tmp_path, model, tokenizer_dict, outtype="f32", name="model"):
    """convert.py --to gguf of `model` saved as a run (once per name); the file's path."""
    run = tmp_path / f"run-{name}"
    if not run.exists():
        run.mkdir()
        write_run(run, model, tokenizer_dict)
    dest = tmp_path / f"{name}-{outtype}.gguf"
    assert convert.main([str(run), str(dest), "--to", "gguf", "--outtype", outtype]) == 0
    return dest


def small(**overrides):
    settings = dict(block_size=64, vocab_size=len(CHARS), n_layer=2, n_head=4, n_embd=32)
    return GPTConfig(**{**settings, **overrides})


def llama_shape(**overrides):
    return small(**{"pos_encoding": "rope", "norm": "rmsnorm", "mlp": "swiglu", "bias": False,
                    "tie_embeddings": False, "rope_theta": 500.0, **overrides})


def read(path):
    reader = gguf.GGUFReader(path)
    fields = {name: field.contents() for name, field in reader.fields.items()}
    tensors = {t.name: t for t in reader.tensors}
    return fields, tensors


def values(tensor):
    """A tensor of the file as float32 numpy in the layout we wrote (rows, cols)."""
    shape = tuple(int(n) for n in reversed(tensor.shape))  # gguf lists dimensions innermost first
    return gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(shape)


# ---------------------------------------------------------------- structure (gguf's reader)


def test_gpt2_shaped_model_is_written_as_gpt2_with_zero_biases_and_an_untied_head(tmp_path):
    model = perturbed_model(small(bias=False, tie_embeddings=False, pad_vocab_multiple=16))
    fields, tensors = read(export(tmp_path, model, CharTokenizer(CHARS).to_dict()))
    assert fields["general.architecture"] == "gpt2"
    assert fields["gpt2.block_count"] == 2
    assert fields["gpt2.attention.head_count"] == 4 and fields["gpt2.feed_forward_length"] == 128
    assert fields["tokenizer.ggml.model"] == "rwkv" and fields["tokenizer.ggml.tokens"] == CHARS
    assert fields["tokenizer.ggml.add_bos_token"] is False
    assert "tokenizer.ggml.eos_token_id" not in fields  # a character vocabulary has none
    sd = model.state_dict()
    assert np.array_equal(values(tensors["token_embd.weight"]), sd["transformer.wte.weight"][: len(CHARS)].numpy())
    assert np.array_equal(values(tensors["output.weight"]), sd["lm_head.weight"][: len(CHARS)].numpy())
    assert np.array_equal(values(tensors["blk.1.attn_qkv.weight"]), sd["transformer.h.1.attn.c_attn.weight"].numpy())
    for name in ("attn_norm", "attn_qkv", "attn_output", "ffn_norm", "ffn_up", "ffn_down"):
        assert not values(tensors[f"blk.0.{name}.bias"]).any()  # bias=False: zeros, as gpt2 needs them
    assert values(tensors["blk.0.ffn_up.bias"]).shape == (128,)


def test_position_tables_cover_llama_cpps_smallest_context(tmp_path):
    from model import sinusoidal_table

    learned = perturbed_model(small())
    wpe = learned.state_dict()["transformer.wpe.weight"]
    for pos, model, expected in (
        ("learned", learned, torch.cat([wpe, torch.zeros(256 - 64, 32)])),  # never trained past 64: zeros
        ("sinusoidal", perturbed_model(small(pos_encoding="sinusoidal")), sinusoidal_table(256, 32)),
        ("none", perturbed_model(small(pos_encoding="none")), torch.zeros(256, 32)),
    ):
        fields, tensors = read(export(tmp_path, model, CharTokenizer(CHARS).to_dict(), name=pos))
        assert np.array_equal(values(tensors["position_embd.weight"]), expected.numpy())
        assert fields["gpt2.context_length"] == 256
        assert "output.weight" not in tensors  # tied: llama.cpp reads token_embd


def our_rotated_scores(q, k, positions, theta):
    cos, sin = rope_angles(max(positions) + 1, q.size(-1), theta)
    q = apply_rope(q, cos[positions], sin[positions])
    k = apply_rope(k, cos[positions], sin[positions])
    return q @ k.T


def neighbour_rotated_scores(q, k, positions, theta):
    """RoPE as llama.cpp's `llama` (and Meta's LLaMA) computes it: pairs (2i, 2i+1)."""
    D = q.size(-1)
    angle = torch.tensor(positions, dtype=torch.float32)[:, None] * theta ** (-torch.arange(0, D, 2) / D)

    def rotate(x):
        even, odd = x[:, 0::2], x[:, 1::2]
        out = torch.empty_like(x)
        out[:, 0::2] = even * angle.cos() - odd * angle.sin()
        out[:, 1::2] = even * angle.sin() + odd * angle.cos()
        return out

    return rotate(q) @ rotate(k).T


def test_llama_rows_are_reordered_so_neighbour_pair_rope_gives_our_attention_scores():
    torch.manual_seed(0)
    H, D, C = 3, 8, 24
    w_q, w_k, x = torch.randn(H * D, C), torch.randn(H * D, C), torch.randn(5, C)
    positions = [0, 1, 2, 7, 20]
    moved_q, moved_k = rotary_to_neighbour_pairs(w_q, H), rotary_to_neighbour_pairs(w_k, H)
    for h in range(H):
        rows = slice(h * D, (h + 1) * D)
        ours = our_rotated_scores(x @ w_q[rows].T, x @ w_k[rows].T, positions, 500.0)
        theirs = neighbour_rotated_scores(x @ moved_q[rows].T, x @ moved_k[rows].T, positions, 500.0)
        assert torch.allclose(ours, theirs, atol=1e-4)
        unmoved = neighbour_rotated_scores(x @ w_q[rows].T, x @ w_k[rows].T, positions, 500.0)
        assert not torch.allclose(ours, unmoved, atol=1e-2)  # without the reordering: other scores


def test_llama_and_qwen3_files_hold_the_split_projections_and_their_settings(tmp_path):
    model = perturbed_model(llama_shape(n_kv_head=2))
    fields, tensors = read(export(tmp_path, model, CharTokenizer(CHARS).to_dict()))
    assert fields["general.architecture"] == "llama"
    assert fields["llama.attention.head_count_kv"] == 2 and fields["llama.rope.dimension_count"] == 8
    assert fields["llama.rope.freq_base"] == 500.0 and fields["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-5)
    assert values(tensors["blk.0.attn_k.weight"]).shape == (16, 32) and values(tensors["blk.0.ffn_gate.weight"]).shape == (88, 32)
    assert not any(name.endswith(".bias") for name in tensors)

    qwen = perturbed_model(llama_shape(qk_norm=True), seed=1)
    fields, tensors = read(export(tmp_path, qwen, CharTokenizer(CHARS).to_dict(), name="qwen"))
    assert fields["general.architecture"] == "qwen3"
    sd = qwen.state_dict()
    assert np.array_equal(values(tensors["blk.1.attn_q_norm.weight"]), sd["transformer.h.1.attn.q_norm.weight"].numpy())
    q_rows = sd["transformer.h.0.attn.c_attn.weight"][:32]
    assert np.array_equal(values(tensors["blk.0.attn_q.weight"]), q_rows.numpy())  # qwen3 rotates halves, as we do


def test_q8_0_quantizes_matrices_whose_rows_fit_its_blocks(tmp_path):
    model = perturbed_model(llama_shape(n_embd=64, mlp_hidden=40))  # ffn_down's rows are 40 long
    _, tensors = read(export(tmp_path, model, CharTokenizer(CHARS).to_dict(), "q8_0"))
    types = {name: t.tensor_type.name for name, t in tensors.items()}
    assert types["blk.0.attn_q.weight"] == types["token_embd.weight"] == "Q8_0"
    assert types["blk.0.ffn_down.weight"] == "F16" and types["blk.0.attn_norm.weight"] == "F32"
    ours = model.state_dict()["transformer.h.0.attn.c_attn.weight"][:64].numpy()
    error = np.abs(values(tensors["blk.0.attn_q.weight"]) - rotary_to_neighbour_pairs(torch.from_numpy(ours), 4).numpy())
    assert 0 < error.max() < np.abs(ours).max() / 127  # 8 bits per block of 32


def test_character_vocabularies_are_stored_whole_with_rwkv_escapes_and_unmatchable_padding(tmp_path):
    chars = WIDE_CHARS + ["\\"]
    model = perturbed_model(small(vocab_size=len(chars) + 3))
    fields, _ = read(export(tmp_path, model, CharTokenizer(chars).to_dict()))
    assert fields["tokenizer.ggml.tokens"] == WIDE_CHARS + ["\\\\"] + [f"\\xff[PAD{i}]" for i in range(3)]
    assert fields["tokenizer.ggml.token_type"] == [1] * len(chars) + [5] * 3
    assert "tokenizer.ggml.merges" not in fields and "tokenizer.ggml.pre" not in fields


def test_bpe_vocabularies_carry_merges_and_end_of_text(tmp_path, tiktoken_available):
    from gptkit.prepare.bpe import train_bpe

    tok = train_bpe(iter(["the cat sat on the mat; the rat ate the hat. " * 20]), 270)
    model = perturbed_model(small(vocab_size=290))  # 20 rows past the tokenizer's
    fields, _ = read(export(tmp_path, model, tok.to_dict()))
    assert fields["tokenizer.ggml.model"] == "gpt2" and fields["tokenizer.ggml.pre"] == "gpt-2"
    symbols = byte_symbols()
    assert fields["tokenizer.ggml.tokens"][:269] == ["".join(symbols[b] for b in t) for t in tok.token_bytes]
    assert len(fields["tokenizer.ggml.tokens"]) == 290 and fields["tokenizer.ggml.tokens"][269] == "<|endoftext|>"
    assert fields["tokenizer.ggml.eos_token_id"] == 269 and len(fields["tokenizer.ggml.merges"]) == 269 - 256
    assert fields["tokenizer.ggml.token_type"][269] == 3 and fields["tokenizer.ggml.token_type"][270:] == [5] * 20


@pytest.mark.parametrize("settings, named", [
    (dict(pos_encoding="rope", norm="rmsnorm", mlp="relu2", bias=False, qk_norm=True, logit_softcap=15.0),
     ["mlp='relu2'", "logit_softcap=15.0", "as qwen3"]),  # the quick start's recipe
    (dict(mlp="gelu_exact"), ["mlp='gelu_exact'"]),
    (dict(norm_placement="post"), ["norm_placement='post'"]),
    (dict(pos_encoding="rope"), ["pos_encoding='rope'"]),
])
def test_architectures_llama_cpp_cannot_run_are_refused_by_name_and_nothing_is_written(tmp_path, settings, named):
    write_run(tmp_path, GPT(small(**settings)), CharTokenizer(CHARS).to_dict())
    with pytest.raises(UserError) as info:
        convert.main([str(tmp_path), str(tmp_path / "m.gguf"), "--to", "gguf"])
    message = str(info.value)
    assert all(n in message for n in named) and "configs/shakespeare_llama.py" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]


def test_which_shipped_configs_export():
    from gptkit.config import parse_settings
    from gptkit.interop.gguf_export import gguf_architecture
    from train import TrainConfig

    def architecture(name):
        model_config, _ = parse_settings([str(REPO / "configs" / name)], [GPTConfig, TrainConfig], prog="train.py")
        return gguf_architecture(model_config)

    assert architecture("shakespeare_llama.py") == "llama"  # the CPU-minutes model docs/gguf.md trains
    assert architecture("gpt2.py") == architecture("shakespeare_char.py") == "gpt2"
    with pytest.raises(UserError, match="mlp='relu2'.*logit_softcap=15.0"):
        architecture("shakespeare.py")  # the quick start: ReLU² and soft-capped logits


def run_convert(*argv, preamble=""):
    code = textwrap.dedent(preamble) + f"\nimport sys, convert\nfrom gptkit.ops.errors import run_main\nsys.argv = ['convert.py', *{list(argv)!r}]\nrun_main(convert.main)\n"
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)


def assert_one_line_error(result, code, *words):
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr, result.stderr
    assert all(w in lines[0] for w in words), lines[0]


def test_bad_sources_and_destinations_are_named_and_leave_nothing(tmp_path):
    run = write_run(tmp_path / "run", GPT(llama_shape()), CharTokenizer(CHARS).to_dict())
    torch.save({"weights": torch.ones(3)}, tmp_path / "other.pt")
    (tmp_path / "taken.gguf").write_text("mine")
    before = sorted(p.name for p in tmp_path.iterdir())
    cases = [
        (tmp_path / "other.pt", tmp_path / "a.gguf", "not a checkpoint of this project"),
        (run, tmp_path / "taken.gguf", "already exists"),
        (run, tmp_path, "is a folder"),
        (run, tmp_path / "no" / "a.gguf", "does not exist"),
        # root writes wherever chmod forbids it, but not into /proc: a folder that takes no files
        (run, "/proc/model.gguf", "the folder /proc cannot be written"),
    ]
    for source, dest, message in cases:
        with pytest.raises(UserError, match=message):
            convert.main([str(source), str(dest), "--to", "gguf"])
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert (tmp_path / "taken.gguf").read_text() == "mine"
    result = run_convert(str(tmp_path / "other.pt"), str(tmp_path / "a.gguf"), "--to", "gguf")
    assert_one_line_error(result, 2, "not a checkpoint of this project")
    assert_one_line_error(run_convert(str(run), "a.gguf", "--to", "gguf", "--outtype", "q4"), 2, "--outtype")
    with pytest.raises(UserError, match="--outtype applies to --to gguf only"):
        convert.main([str(run), str(tmp_path / "hf"), "--to", "hf", "--outtype", "f32"])
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_full_disk_is_one_line_and_leaves_no_partial_file(tmp_path):
    run = write_run(tmp_path / "run", GPT(llama_shape(n_embd=128, n_layer=4)), CharTokenizer(CHARS).to_dict())
    preamble = """
        import resource, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG from write() instead of a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))  # the file is ~1 MB
    """
    result = run_convert(str(run), str(tmp_path / "m.gguf"), "--to", "gguf", "--outtype", "f32", preamble=preamble)
    assert_one_line_error(result, 1, "could not write", "m.gguf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


# ---------------------------------------------------------------- llama.cpp itself


def llama_cpp_model(path, n_ctx=64, kv_f32=False):
    """llama.cpp's model (with kv_f32, its KV cache in f32 instead of its default f16) with repacking off (llama-cli's --no-repack): on this project's CI
    machine (a Xeon with AMX, virtualized), llama.cpp's repacked CPU kernels crash on a
    q8_0 prompt of more than one token, for files quantized by llama.cpp itself too.
    Repacking is a speed-up: the same quantized weights in another layout, other kernels."""
    defaults = llama_cpp.llama_cpp.llama_model_default_params

    def without_repacking():
        params = defaults()
        params.use_extra_bufts = False
        return params

    llama_cpp.llama_cpp.llama_model_default_params = without_repacking  # read once, by Llama()
    try:
        kv = dict(type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32) if kv_f32 else {}
        return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, logits_all=True,
                               n_threads=1, verbose=False, seed=0, **kv)
    finally:
        llama_cpp.llama_cpp.llama_model_default_params = defaults


def llama_cpp_logits(path, ids, kv_f32=False):
    llm = llama_cpp_model(path, kv_f32=kv_f32)
    llm.eval(ids)
    return torch.from_numpy(np.array(llm.scores[: len(ids)], dtype=np.float32))  # (T, vocab)


def our_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids]))[0][0]  # (T, vocab)


def compare(model, path, ids, kv_f32=False):
    ours, theirs = our_logits(model, ids), llama_cpp_logits(path, ids, kv_f32)
    return (ours - theirs).abs().max().item(), (ours.argmax(-1) == theirs.argmax(-1)).float().mean().item()


SHAPES = {
    "gpt2": small(), "gpt2-untied-biasfree-gqa": small(tie_embeddings=False, bias=False, n_kv_head=2),
    "gpt2-sinusoidal": small(pos_encoding="sinusoidal"), "llama-gqa": llama_shape(n_kv_head=2),
    "llama-tied": llama_shape(tie_embeddings=True, pad_vocab_multiple=64), "qwen3": llama_shape(qk_norm=True),
}


@needs_llama_cpp
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_llama_cpp_gives_our_logits_at_every_position(tmp_path, shape):
    model = perturbed_model(SHAPES[shape])
    ids = CharTokenizer(CHARS).encode(TEXT_60)
    assert len(ids) == 60
    for outtype in ("f32", "f16"):
        path = export(tmp_path, model, CharTokenizer(CHARS).to_dict(), outtype)
        worst, same_top = compare(model, path, ids)
        assert worst <= 1e-2 and same_top == 1.0, (outtype, worst, same_top)


@needs_llama_cpp
def test_llama_cpp_generates_past_the_models_context_without_aborting(tmp_path):
    for name, config in (("gpt2", small(block_size=16)), ("llama", llama_shape(block_size=16))):
        llm = llama_cpp_model(export(tmp_path, perturbed_model(config), CharTokenizer(CHARS).to_dict(), name=name), 256)
        out = llm.create_completion("First", max_tokens=100, temperature=0.8, seed=1)
        assert out["usage"]["completion_tokens"] == 100  # no end-of-text token stopped it either


TEXTS = [
    "First Citizen:\nBefore we proceed any further, hear me speak.",
    "  two  spaces,\ttabs\n\n\nand newlines \n end ",
    "it's 1,234.5 o'clock -- isn't it?! (yes); [no] {maybe} @#%&*",
    "ünïcødé, 日本語 and 🙂 too",
]


@needs_llama_cpp
def test_llama_cpp_tokenizes_as_our_gpt2_and_trained_bpe(tmp_path, tiktoken_available, shakespeare_path):
    from gptkit.prepare.bpe import train_bpe

    trained = train_bpe(iter([shakespeare_path.read_text()[:200_000]]), 1024)
    for name, tok in (("gpt2", GPT2Tokenizer()), ("bpe", trained)):
        model = GPT(llama_shape(vocab_size=tok.vocab_size, n_layer=1, n_embd=16, n_head=2))
        llm = llama_cpp_model(export(tmp_path, model, tok.to_dict(), "q8_0", name=name), n_ctx=16)
        for text in TEXTS + [shakespeare_path.read_text()[:5000]]:
            ids = llm.tokenize(text.encode(), add_bos=False, special=False)
            assert ids == tok.encode(text), (name, text[:40])
            assert llm.detokenize(ids).decode() == text
        assert llm.token_eos() == tok.eot_id


@needs_llama_cpp
def test_llama_cpp_tokenizes_character_vocabularies_as_we_do(tmp_path, shakespeare_path):
    shakespeare = shakespeare_path.read_text()[:20_000]
    for name, chars, texts in (
        ("ascii", sorted(set(shakespeare)), [shakespeare, TEXTS[0], TEXTS[1]]),
        ("wide", WIDE_CHARS + ["\\"], ["Before “we” speak — é, ü, 日本 🙂!\n", "日日🙂é \\n\\\\"]),
    ):
        tok = CharTokenizer(chars)
        llm = llama_cpp_model(export(tmp_path, GPT(small(vocab_size=len(chars))), tok.to_dict(), name=name))
        for text in texts:
            text = "".join(ch for ch in text if ch in tok.stoi)
            ids = llm.tokenize(text.encode(), add_bos=False, special=False)
            assert ids == tok.encode(text), (name, text[:40])
            assert llm.detokenize(ids).decode() == text
        assert llm.token_eos() == -1  # no end of text: generation never stops at a character


def train_briefly(model, ids, steps):
    """Enough AdamW steps on one text for the model to predict it with confidence."""
    torch.manual_seed(0)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = torch.tensor(ids)
    T = model.config.block_size
    for _ in range(steps):
        starts = torch.randint(0, len(data) - T - 1, (16,))
        x = torch.stack([data[s : s + T] for s in starts])
        y = torch.stack([data[s + 1 : s + T + 1] for s in starts])
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval(), loss.item()


@needs_llama_cpp
@pytest.mark.slow
def test_a_trained_model_keeps_its_logits_and_q8_0_its_top_token(tmp_path, shakespeare_path):
    text = shakespeare_path.read_text()[:100_000]
    tok = CharTokenizer(sorted(set(text)))
    torch.manual_seed(0)  # the initial weights too: the test must not depend on the tests run before it
    model, loss = train_briefly(GPT(llama_shape(vocab_size=tok.vocab_size, n_embd=64)), tok.encode(text), 300)
    assert loss < 2.4, loss  # it learned something: the top token means something
    ids = tok.encode(text[-60:])
    for outtype in ("f32", "f16"):  # trained weights are larger than random ones: a harder test
        # llama.cpp's KV cache in f32: its default f16 cache rounds keys and values by ~5e-3,
        # enough to flip a near-tie of the top token, which says nothing about our file
        worst, same_top = compare(model, export(tmp_path, model, tok.to_dict(), outtype), ids, kv_f32=True)
        assert worst <= 1e-2 and same_top == 1.0, (outtype, worst, same_top)
    worst, same_top = compare(model, export(tmp_path, model, tok.to_dict(), "q8_0"), ids)
    assert same_top >= 0.9, (worst, same_top)


# ---------------------------------------------------------------- edges: overflow, late writers, signals


@pytest.mark.parametrize("outtype, where, value", [
    ("f16", "transformer.h.0.mlp.c_fc.weight", 1e5),  # beyond f16's 65504
    ("f16", "transformer.h.0.mlp.c_fc.weight", -65520.0),  # the least that rounds to -inf
    ("q8_0", "lm_head.weight", 1e7),  # a block scale 1e7 / 127 beyond f16
])
def test_a_weight_a_lossy_outtype_cannot_hold_is_refused_by_name_and_nothing_is_written(tmp_path, outtype, where, value):
    model = GPT(llama_shape(n_embd=64))
    with torch.no_grad():
        model.state_dict()[where][1, 3] = value
    run = write_run(tmp_path / "run", model, CharTokenizer(CHARS).to_dict())
    result = run_convert(str(run), str(tmp_path / "m.gguf"), "--to", "gguf", "--outtype", outtype)
    assert_one_line_error(result, 2, f"--outtype {outtype}", f"{abs(value):.6g}", "f32")
    assert "Warning" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert convert.main([str(run), str(tmp_path / "m.gguf"), "--to", "gguf", "--outtype", "f32"]) == 0  # f32 holds it


def test_the_largest_value_f16_holds_is_exported_as_it_is(tmp_path):
    model = GPT(llama_shape(n_embd=64))
    with torch.no_grad():
        model.transformer.h[0].mlp.c_fc.weight[0, 0] = 65504.0
    _, tensors = read(export(tmp_path, model, CharTokenizer(CHARS).to_dict(), "f16"))
    largest = {name: np.abs(values(t)).max() for name, t in tensors.items()}
    assert all(np.isfinite(v) for v in largest.values()) and max(largest.values()) == 65504.0


CONTROL_CHARS = [chr(i) for i in range(32)] + ["\x7f"]


def test_a_nul_in_a_character_vocabulary_is_stored_escaped(tmp_path):
    chars = CONTROL_CHARS + ["a", "\\"]
    fields, _ = read(export(tmp_path, perturbed_model(small(vocab_size=len(chars))), CharTokenizer(chars).to_dict()))
    tokens = fields["tokenizer.ggml.tokens"]
    assert tokens[0] == "\\x00" and tokens[1:33] == CONTROL_CHARS[1:] and tokens[33:] == ["a", "\\\\"]


@needs_llama_cpp
def test_llama_cpp_tokenizes_every_control_character_nul_included_as_we_do(tmp_path):
    chars = CONTROL_CHARS + list("ab x0\\")
    tok = CharTokenizer(chars)
    llm = llama_cpp_model(export(tmp_path, GPT(small(vocab_size=len(chars))), tok.to_dict()))
    texts = ["".join(CONTROL_CHARS), "a\x00b", "\x00", "x\\x00\x00\\"] + [f"a{ch}b" for ch in CONTROL_CHARS]
    for text in texts:
        ids = llm.tokenize(text.encode(), add_bos=False, special=False)
        assert ids == tok.encode(text), repr(text)
        assert llm.detokenize(ids).decode() == text


def test_a_file_that_appears_at_the_destination_during_the_export_is_left_untouched(tmp_path, monkeypatch):
    from gptkit.interop import gguf_export

    run = write_run(tmp_path / "run", GPT(llama_shape()), CharTokenizer(CHARS).to_dict())
    dest = tmp_path / "m.gguf"
    real_write = gguf_export.write_gguf

    def write_while_another_program_creates_dest(path, *args):
        real_write(path, *args)
        dest.write_text("another program's")

    monkeypatch.setattr(gguf_export, "write_gguf", write_while_another_program_creates_dest)
    with pytest.raises(UserError, match="m.gguf appeared while this command was writing it"):
        convert.main([str(run), str(dest), "--to", "gguf"])
    assert dest.read_text() == "another program's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf", "run"]  # no temporary left


def test_two_conversions_to_one_new_name_publish_one_file_and_the_other_fails(tmp_path):
    models = {seed: perturbed_model(llama_shape(n_embd=128, n_layer=4), seed=seed) for seed in (1, 2)}
    runs = {seed: write_run(tmp_path / f"run{seed}", model, CharTokenizer(CHARS).to_dict()) for seed, model in models.items()}
    dest = tmp_path / "m.gguf"
    code = "import sys, convert\nfrom gptkit.ops.errors import run_main\nsys.argv = ['convert.py', *sys.argv[1:]]\nrun_main(convert.main)\n"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(run), str(dest), "--to", "gguf", "--outtype", "f32"],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for run in runs.values()]
    results = [(p.wait(), *p.communicate()) for p in procs]
    assert sorted(code for code, _, _ in results) == [0, 2], results
    winner = next(seed for seed, (code, _, _) in zip(runs, results) if code == 0)
    (_, _, err), = [r for r in results if r[0] == 2]
    assert ("appeared while this command was writing it" in err or "already exists" in err) and len(err.strip().splitlines()) == 1, err
    _, tensors = read(dest)  # the winner's model, whole
    ours = models[winner].state_dict()["transformer.h.0.mlp.c_proj.weight"].numpy()
    assert np.array_equal(values(tensors["blk.0.ffn_down.weight"]), ours)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf", "run1", "run2"]


def test_sigterm_during_the_export_leaves_no_temporary_file(tmp_path):
    run = write_run(tmp_path / "run", GPT(llama_shape()), CharTokenizer(CHARS).to_dict())
    preamble = """
        import os, signal
        from gptkit.interop import gguf_export
        real_write = gguf_export.write_gguf
        def write_then_terminated(path, *args):
            real_write(path, *args)
            assert os.path.exists(path)  # the temporary, written
            os.kill(os.getpid(), signal.SIGTERM)  # a timeout, a scheduler, systemd
        gguf_export.write_gguf = write_then_terminated
    """
    result = run_convert(str(run), str(tmp_path / "m.gguf"), "--to", "gguf", preamble=preamble)
    assert result.returncode == 128 + 15, result.stderr
    assert "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
