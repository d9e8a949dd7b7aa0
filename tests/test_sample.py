"""sample.py on a tiny random GPT saved in tmp_path: reproducibility, greedy decoding,
--stop, streaming, prompts, and the messages for bad prompts and bad checkpoints."""

import dataclasses
import os
import subprocess
import sys
import types

import pytest
from malicious import RunsCode
import torch

from gptkit.generation import generate
from gptkit.ops.checkpoint import save_checkpoint
from gptkit.ops.errors import UserError, run_main
from gptkit.data.tokenizer import CharTokenizer, tokenizer_from_dict
from model import GPT, GPTConfig
from repo import REPO
import sample

# No '-' in the vocabulary, so the separator line can only be the separator.
CHARS = sorted(set("\n !,.:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"))
BLOCK = 16
SEP = "\n" + "-" * 15 + "\n"




def tiny_model(seed=0, sharpen=40.0):
    config = GPTConfig(block_size=BLOCK, vocab_size=len(CHARS), n_layer=2, n_head=2, n_embd=16)
    torch.manual_seed(seed)
    model = GPT(config)
    with torch.no_grad():  # sharper predictions than N(0, 0.02) gives, so argmax has no near-ties
        model.transformer.wte.weight.mul_(sharpen)
    return model.eval()


def save_tiny(path, net, **extra):
    """Save `net` in train.py's checkpoint layout; `extra` replaces or adds keys."""
    ckpt = {
        "format_version": 1,
        "model": net.state_dict(),
        "model_config": dataclasses.asdict(net.config),
        "tokenizer": {"type": "char", "chars": CHARS},
        "config": {},
        "iter_num": 42,
        "best_val_loss": 2.25,
        "val_loss": 2.25,
        **extra,
    }
    save_checkpoint(ckpt, path)
    return path


@pytest.fixture
def tiny(tmp_path):
    """(model, out_dir) with out_dir/best.pt holding the model."""
    model = tiny_model()
    out = tmp_path / "out"
    save_tiny(out / "best.pt", model)
    return model, out


def run_sample(capsys, *argv):
    """(stdout, stderr) of sample.main(argv)."""
    capsys.readouterr()
    assert sample.main(list(argv)) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


def run_cli(capsys, *argv):
    """(exit code, stderr) of sample.py as the command line runs it, via errors.run_main."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        run_main(sample.main, list(argv))
    return exit_info.value.code, capsys.readouterr().err


def samples_of(out):
    assert out.endswith(SEP), out[-40:]
    return out[: -len(SEP)].split(SEP)


def greedy_by_hand(model, prompt, n):
    """The argmax token at every step, recomputing the cropped context with forward()."""
    tok = CharTokenizer(CHARS)
    ids = tok.encode(prompt)
    with torch.no_grad():
        for _ in range(n):
            logits, _ = model(torch.tensor([ids[-BLOCK:]]))
            ids.append(int(logits[0, -1].argmax()))
    return tok.decode(ids)


def test_same_seed_same_text_and_another_seed_differs(tiny, capsys):
    _, out = tiny
    args = ["--out_dir", str(out), "--start", "ROMEO:", "--max_new_tokens", "40", "--num_samples", "3", "--temperature", "1.0"]
    first, err = run_sample(capsys, *args, "--seed", "5")
    second, _ = run_sample(capsys, *args, "--seed", "5")
    other, _ = run_sample(capsys, *args, "--seed", "6")
    assert first == second
    assert first != other
    texts = samples_of(first)
    assert len(texts) == 3 and all(t.startswith("ROMEO:") for t in texts)
    assert len(set(texts)) == 3  # the rows of the batch are sampled independently
    assert f"loaded {out / 'best.pt'}" in err and "iteration 42" in err and "val loss 2.2500" in err


def test_key_value_and_key_equals_value_agree(tiny, capsys):
    _, out = tiny
    spaced, _ = run_sample(capsys, "--out_dir", str(out), "--seed", "3", "--max_new_tokens", "20", "--start", "AB")
    equals, _ = run_sample(capsys, f"--out_dir={out}", "--seed=3", "--max_new_tokens=20", "--start=AB")
    assert spaced == equals
    assert len(samples_of(spaced)) == 10  # nanoGPT's default num_samples


@pytest.mark.parametrize(
    "n, options",
    [
        (BLOCK - 6, []),  # within block_size, with the defaults
        (2 * BLOCK + 5, ["--shift_context", "false"]),  # past it, cropping the context as nanoGPT does
        (2 * BLOCK + 5, ["--use_cache", "false"]),
    ],
)
def test_temperature_zero_is_greedy(tiny, capsys, n, options):
    model, out = tiny
    expected = greedy_by_hand(model, "ROMEO:", n)
    got, _ = run_sample(capsys, "--out_dir", str(out), "--start", "ROMEO:", "--temperature", "0",
                        "--max_new_tokens", str(n), "--num_samples", "2", *options)
    assert samples_of(got) == [expected, expected]


def test_bfloat16_weights_sample_like_float32(tiny, capsys, monkeypatch):
    model, out = tiny
    cast_to = []
    real_to = torch.nn.Module.to
    monkeypatch.setattr(torch.nn.Module, "to", lambda self, *a, **k: cast_to.append(k.get("dtype")) or real_to(self, *a, **k))
    args = ["--out_dir", str(out), "--start", "ROMEO:", "--temperature", "0", "--max_new_tokens", "12", "--num_samples", "1"]
    half, _ = run_sample(capsys, *args, "--dtype", "bfloat16")
    assert torch.bfloat16 in cast_to  # the weights themselves were cast, not autocast
    full, _ = run_sample(capsys, *args, "--dtype", "float32")
    # bfloat16 keeps ~3 significant digits: the first greedy tokens agree.
    assert samples_of(half)[0][:12] == samples_of(full)[0][:12]


def test_shift_context_keeps_caching_past_block_size(tmp_path, capsys):
    out = tmp_path / "flat"
    save_tiny(out / "best.pt", tiny_model(sharpen=1.0))  # near-uniform: the samples vary
    args = ["--out_dir", str(out), "--start", "ROMEO:", "--temperature", "1.0", "--top_k", "none",
            "--max_new_tokens", str(3 * BLOCK)]  # one random draw per step in both: they agree until the contexts differ
    shifted = samples_of(run_sample(capsys, *args, "--num_samples", "1")[0])[0]
    exact = samples_of(run_sample(capsys, *args, "--num_samples", "1", "--shift_context", "false")[0])[0]
    assert shifted[:BLOCK + 1] == exact[:BLOCK + 1]  # the same until the context is first full
    assert len(shifted) == len(exact) == 6 + 3 * BLOCK
    assert shifted != exact  # later tokens saw a shorter context: shift_context is on by default


def test_top_k_1_is_greedy(tiny, capsys):
    model, out = tiny
    expected = greedy_by_hand(model, "JULIET", 2 * BLOCK)
    got, _ = run_sample(capsys, "--out_dir", str(out), "--start", "JULIET", "--top_k", "1", "--shift_context", "false",
                        "--temperature", "1.0", "--max_new_tokens", str(2 * BLOCK), "--num_samples", "1")
    assert samples_of(got) == [expected]


def test_stop_cuts_each_sample_before_the_string(tiny, capsys):
    _, out = tiny
    args = ["--out_dir", str(out), "--start", "A", "--max_new_tokens", "60", "--num_samples", "4",
            "--temperature", "1.0", "--top_k", "none", "--seed", "11"]
    full = [t[1:] for t in samples_of(run_sample(capsys, *args)[0])]
    stop = full[0][20:22]  # a string sample 1 certainly contains
    got = [t[1:] for t in samples_of(run_sample(capsys, *args, "--stop", stop)[0])]
    expected = [t[: t.find(stop)] if stop in t else t for t in full]
    assert got == expected
    assert len(got[0]) <= 20 and not any(stop in t for t in got)


def test_stop_escape_newline(tmp_path, capsys):
    out = tmp_path / "flat"
    save_tiny(out / "best.pt", tiny_model(sharpen=1.0))  # near-uniform: newlines come often
    args = ["--out_dir", str(out), "--start", "A", "--max_new_tokens", "200", "--num_samples", "3", "--top_k", "none"]
    full = samples_of(run_sample(capsys, *args)[0])
    assert any("\n" in t for t in full)  # otherwise this test shows nothing
    got = samples_of(run_sample(capsys, *args, "--stop", "\\n")[0])  # typed in a shell as --stop "\n"
    assert got == [t.split("\n")[0] for t in full]


def test_sample_one_streams_as_it_is_generated(tiny):
    model, _ = tiny
    tok = CharTokenizer(CHARS)
    cfg = sample.SampleConfig(num_samples=3, max_new_tokens=30, temperature=1.0)
    pieces = []
    texts = generate.generate_samples(model, tok, tok.encode("AB"), cfg, torch.device("cpu"), on_text=pieces.append)
    assert len(texts) == 3 and all(len(t) == 30 for t in texts)
    assert "".join(pieces) == texts[0]
    assert sum(1 for p in pieces if p) == 30  # one character per step, not all at the end


def test_prompt_from_file_and_missing_file(tiny, tmp_path, capsys):
    model, out = tiny
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text("KING:\nAh", encoding="utf-8")
    got, _ = run_sample(capsys, "--out_dir", str(out), f"--start=FILE:{prompt_file}", "--temperature", "0",
                        "--max_new_tokens", "10", "--num_samples", "1")
    assert samples_of(got) == [greedy_by_hand(model, "KING:\nAh", 10)]
    with pytest.raises(UserError, match="prompt file .*nope.txt does not exist"):
        sample.main(["--out_dir", str(out), f"--start=FILE:{tmp_path / 'nope.txt'}"])


def test_unknown_prompt_characters_are_listed(tiny, capsys):
    _, out = tiny
    code, err = run_cli(capsys, "--out_dir", str(out), "--start", "ROMEO: 3 apples @ 5%")
    assert code == 2
    assert "outside this model's character vocabulary" in err
    for ch in "'3'", "'@'", "'5'", "'%'":
        assert ch in err
    assert "Traceback" not in err


@pytest.mark.parametrize("extra", [[], ["--compile", "true"], ["--attention", "a.png", "--layer", "5"]])
def test_a_mistake_found_after_loading_is_the_only_line_printed(tiny, capsys, extra):
    _, out = tiny
    start = "ROMEO:" if "--layer" in extra else "@@@"
    code, err = run_cli(capsys, "--out_dir", str(out), "--start", start, *extra)
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("error: "), err


def test_default_out_dir_prefers_best_then_ckpt(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    model = tiny_model()
    save_tiny(tmp_path / "out-shakespeare" / "ckpt.pt", model, iter_num=100)
    _, err = run_sample(capsys, "--max_new_tokens", "3", "--start", "A")
    assert f"loaded {os.path.join('out-shakespeare', 'ckpt.pt')}" in err and "iteration 100" in err
    save_tiny(tmp_path / "out-shakespeare" / "best.pt", model, iter_num=80)
    _, err = run_sample(capsys, "--max_new_tokens", "3", "--start", "A")
    assert f"loaded {os.path.join('out-shakespeare', 'best.pt')}" in err and "iteration 80" in err


def test_missing_checkpoint_says_how_to_train(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, err = run_cli(capsys, "--start", "A")  # no out-shakespeare/ here
    assert code == 2 and "out-shakespeare does not exist" in err
    assert "python train.py configs/shakespeare.py" in err
    (tmp_path / "empty_run").mkdir()
    code, err = run_cli(capsys, "--out_dir", "empty_run")
    assert code == 2 and "no checkpoint in empty_run" in err and "best.pt and ckpt.pt" in err
    code, err = run_cli(capsys, "--ckpt", "nowhere.pt")
    assert code == 2 and "nowhere.pt does not exist" in err and "Traceback" not in err


def test_truncated_empty_and_foreign_files_are_named(tiny, tmp_path, capsys):
    _, out = tiny
    data = (out / "best.pt").read_bytes()
    middle = len(data) // 2
    cases = {
        "truncated.pt": (data[:middle], "truncated"),
        "empty.pt": (b"", "is empty"),
        "notes.pt": (b"my notes, not a checkpoint\n" * 20, "not a PyTorch checkpoint"),
        "flipped.pt": (data[:middle] + bytes(b ^ 0xFF for b in data[middle : middle + 64]) + data[middle + 64 :], "corrupted"),
    }
    for name, (content, message) in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        code, err = run_cli(capsys, "--ckpt", str(path))
        assert code == 2, name
        assert str(path) in err and message in err, err
        assert "Traceback" not in err
    # a real PyTorch file that is not a checkpoint of ours or nanoGPT's
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    code, err = run_cli(capsys, "--ckpt", str(tmp_path / "other.pt"))
    assert code == 2 and "not a checkpoint of this project or of nanoGPT (its keys: weights)" in err


def test_checkpoint_that_does_not_fit_its_config(tiny, tmp_path, capsys):
    model, _ = tiny
    state = model.state_dict()
    state.pop("transformer.ln_f.weight")
    save_tiny(tmp_path / "bad.pt", model, model=state)
    code, err = run_cli(capsys, "--ckpt", str(tmp_path / "bad.pt"))
    assert code == 2 and "do not fit" in err and "missing transformer.ln_f.weight" in err




def test_checkpoint_that_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pt"
    torch.save({"format_version": 1, "model": RunsCode(marker)}, evil)
    result = subprocess.run(
        [sys.executable, "sample.py", "--ckpt", str(evil)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert "refusing to load" in result.stderr and str(evil) in result.stderr
    assert "Traceback" not in result.stderr
    assert not marker.exists()
    # The file really is an attack: an unsafe load runs the command.
    torch.load(evil, weights_only=False)
    assert marker.exists()


def test_attention_draws_and_does_not_sample(tiny, tmp_path, monkeypatch, capsys):
    model, out = tiny
    calls = []

    def draw_attention(model, tokenizer, text, layer, path):
        calls.append((model.config.n_layer, tokenizer.decode(tokenizer.encode(text)), layer, path))
        return path

    monkeypatch.setitem(sys.modules, "gptkit.evals.attention_plot", types.SimpleNamespace(draw_attention=draw_attention))
    got, err = run_sample(capsys, "--out_dir", str(out), "--start", "ROMEO:", "--attention", "a.png", "--layer", "1")
    assert calls == [(2, "ROMEO:", 1, "a.png")]
    assert got == "" and "wrote a.png" in err
    code, err = run_cli(capsys, "--out_dir", str(out), "--attention", "a.png", "--layer", "2")
    assert code == 2 and "layers 0 to 1" in err


def test_bad_settings_are_rejected(tiny, capsys):
    _, out = tiny
    code, err = run_cli(capsys, "--out_dir", str(out), "--temprature", "0.5")
    assert code == 2 and "did you mean 'temperature'" in err
    code, err = run_cli(capsys, "--out_dir", str(out), "--top_p", "1.5")
    assert code == 2 and "top_p" in err
    code, err = run_cli(capsys, "--init_from", "gpt3")
    assert code == 2 and "init_from='gpt3'" in err


def test_unescape():
    assert sample.unescape("a\\nb\\tc\\\\n") == "a\nb\tc\\n"
    assert sample.unescape("plain é") == "plain é"


def test_attention_png_from_a_checkpoint(tiny, tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="matplotlib draws the attention plot")
    _, out = tiny
    png = tmp_path / "attn.png"
    got, err = run_sample(capsys, "--out_dir", str(out), "--start", "ROMEO:", "--attention", str(png), "--layer", "1")
    assert got == "" and f"wrote {png}" in err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_attention_destination_is_checked_before_the_model_loads_and_written_whole(tiny, tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib", reason="matplotlib draws the attention plot")
    _, out = tiny
    loaded = []
    monkeypatch.setattr(sample, "load_model", lambda *a, **k: loaded.append(a) or (_ for _ in ()).throw(AssertionError("loaded")))
    for bad, what in ((tmp_path, "folder"), (tmp_path / ("x" * 300 + ".png"), "255 bytes"), ("/dev/full", "not a regular file")):
        code, err = run_cli(capsys, "--out_dir", str(out), "--attention", str(bad))
        assert code == 2 and what in err and len(err.strip().splitlines()) == 1, err
    assert loaded == []
    monkeypatch.undo()
    png = tmp_path / "old.png"
    png.write_bytes(b"an earlier picture")  # a picture is redrawn in place, as matplotlib would
    got, err = run_sample(capsys, "--out_dir", str(out), "--start", "ROMEO:", "--attention", str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left


def test_init_from_a_local_hugging_face_folder(tmp_path, capsys, tiktoken_available):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf_config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=16, n_positions=32, vocab_size=50257)
    hf = transformers.GPT2LMHeadModel(hf_config).eval()
    hf.save_pretrained(tmp_path / "tiny-gpt2")
    tok = tokenizer_from_dict({"type": "gpt2"})
    ids = tok.encode("Hello, world")
    with torch.no_grad():
        for _ in range(8):  # greedy with the reference implementation
            ids.append(int(hf(torch.tensor([ids])).logits[0, -1].argmax()))
    got, err = run_sample(capsys, "--init_from", str(tmp_path / "tiny-gpt2"), "--start", "Hello, world",
                          "--temperature", "0", "--max_new_tokens", "8", "--num_samples", "1")
    assert f"loaded pretrained {tmp_path / 'tiny-gpt2'}" in err
    assert samples_of(got) == [tok.decode(ids)]


# ---- values that used to end in tracebacks or absurd allocations --------------------


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--temperature", "inf"], "temperature=inf must be a finite number"),
        (["--temperature", "nan"], "temperature=nan must be a finite number"),
        (["--repetition_penalty", "inf"], "repetition_penalty=inf must be a finite number"),
        (["--repetition_penalty", "1e-300"], "repetition_penalty=1e-300 must be a finite number between 0.01"),
        (["--seed", str(2**70)], "seed=.* must be between 0 and 2\\*\\*63 - 1"),
        (["--max_new_tokens", str(10**12)], "max_new_tokens=.* must be between 0 and 1,000,000"),
        (["--num_samples", "4000", "--max_new_tokens", "900000"], "tokens in one batch"),
    ],
)
def test_unusable_sampling_values_are_refused(tiny, flags, message):
    _, out = tiny
    with pytest.raises(UserError, match=message):
        sample.main(["--out_dir", str(out), *flags])


def test_a_tiny_temperature_is_greedy_not_nan(tiny, capsys):
    _, out = tiny
    greedy, _ = run_sample(capsys, "--out_dir", str(out), "--start", "AB", "--temperature", "0", "--max_new_tokens", "30", "--num_samples", "1")
    tiny_t, _ = run_sample(capsys, "--out_dir", str(out), "--start", "AB", "--temperature", "1e-30", "--max_new_tokens", "30", "--num_samples", "1")
    assert tiny_t == greedy


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda c: c["model_config"].update(n_embd=10**9), "do not fit the model its config describes"),
        (lambda c: c["model_config"].update(n_layer=10**9), "n_layer=1000000000 but the weights hold 2 blocks"),
        (lambda c: c["model_config"].update(n_layer="2"), "values of the wrong type: n_layer='2'"),
        (lambda c: c["model_config"].update(secret_field=1), "fields this model.py does not know"),
        (lambda c: c.update(model_config=[1, 2]), "model_config is a list"),
        (lambda c: next(iter(c["model"].values())).fill_(float("nan")), "holds NaN or inf"),
    ],
)
def test_a_checkpoint_with_absurd_or_broken_fields_is_refused_before_allocating(tmp_path, change, message):
    path = tmp_path / "best.pt"
    save_tiny(path, tiny_model())
    ckpt = torch.load(path, weights_only=True)
    change(ckpt)
    torch.save(ckpt, path)
    with pytest.raises(UserError, match=message):
        sample.main(["--ckpt", str(path), "--max_new_tokens", "5"])


def test_compile_gives_the_same_text_through_one_compiled_graph(tiny, capsys, monkeypatch):
    """--compile: 40 tokens past block_size (16), shift_context rebuilding the cache, and
    one graph for them all (dynamo's "eager" backend: the same guards as inductor)."""
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **options: real_compile(fn, **{**options, "backend": "eager"}))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    _, out = tiny
    args = ("--out_dir", str(out), "--temperature", "0", "--max_new_tokens", "40", "--num_samples", "2")
    try:
        plain, _ = run_sample(capsys, *args)
        compiled, _ = run_sample(capsys, *args, "--compile", "true")
        assert compiled == plain
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    finally:
        torch._dynamo.reset()


def test_compile_without_the_cache_is_refused(tiny, capsys):
    _, out = tiny
    code, err = run_cli(capsys, "--out_dir", str(out), "--compile", "true", "--use_cache", "false")
    assert code == 2 and "compile=true compiles the cached one-token step: it needs use_cache=true" in err
