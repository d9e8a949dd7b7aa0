"""eval.py against independent implementations: transformers' GPT-2 for the windowed loss,
bits per byte and HellaSwag's three figures, and train.py's own eval_iters=0 val loss; plus its errors."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

import eval as eval_script
import train
from gptkit.ops.errors import run_main
from gptkit.ops.checkpoint import load_checkpoint
from train_helpers import sample_text, tiny_args, write_char_dataset

transformers = pytest.importorskip("transformers")  # a test-only dependency

TEXT = (
    "The quick brown fox jumps over the lazy dog. Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich; "
    "naïve café owners in 東京 say 🙂 to everyone.\n\nA second paragraph follows, with numbers 12345 and symbols #@!"
)


def exit_code(argv, capsys=None):
    with pytest.raises(SystemExit) as info:
        run_main(eval_script.main, argv)
    return info.value.code


def run_json(argv, capsys):
    assert eval_script.main([*argv, "--json", "-", "--device", "cpu", "--dtype", "float32"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def hf_folder(tmp_path, tiktoken_available):
    """A random GPT-2 with the real vocabulary, block 16, saved in Hugging Face format."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, n_positions=16, vocab_size=50257)
    model = transformers.GPT2LMHeadModel(config).eval()
    folder = tmp_path / "hf"
    model.save_pretrained(folder)
    return folder, model


def hf_windowed_nats(model, ids, block_size, stride):
    """Sliding-window loss written out with transformers: each window of up to block_size
    inputs, its targets shifted by one, only those not scored by an earlier window."""
    total, count, scored_end = 0.0, 0, 0
    for start in range(0, len(ids), stride):
        if scored_end >= len(ids) - 1:
            break
        window = ids[start : start + block_size + 1]
        with torch.no_grad():
            logits = model(torch.tensor(window[:-1])[None]).logits[0]
        losses = F.cross_entropy(logits, torch.tensor(window[1:]), reduction="none")
        new = [k for k in range(len(window) - 1) if start + 1 + k > scored_end]
        total += losses[new].sum().item()
        count += len(new)
        scored_end = start + len(window) - 1
    return total, count


@pytest.mark.parametrize("stride", [16, 5])
def test_windowed_loss_and_bpb_equal_transformers(hf_folder, tmp_path, capsys, stride):
    import tiktoken

    folder, hf = hf_folder
    (tmp_path / "text.txt").write_text(TEXT)
    out = run_json(["--init_from", str(folder), "--input", str(tmp_path / "text.txt"), "--stride", str(stride),
                    "--batch_size", "3"], capsys)
    row = out["models"][0]
    ids = tiktoken.get_encoding("gpt2").encode_ordinary(TEXT)
    nats, count = hf_windowed_nats(hf, ids, 16, stride)
    assert row["tokens"] == count == len(ids) - 1
    assert row["loss"] * row["tokens"] == pytest.approx(nats, rel=1e-4)
    first = tiktoken.get_encoding("gpt2").decode_single_token_bytes(ids[0])
    n_bytes = len(TEXT.encode("utf-8")) - len(first)  # every byte but the first token's
    assert row["bytes"] == n_bytes
    assert row["bpb"] == pytest.approx(nats / (math.log(2) * n_bytes), rel=1e-4)
    assert row["ppl"] == pytest.approx(math.exp(nats / count), rel=1e-4)


def write_hellaswag(path, n=6):
    items = []
    for i in range(n):
        items.append({"ind": i, "ctx": f"A man is standing in a kitchen number {i}. He",
                      "endings": ["picks up a knife and cuts the onion.", "flies to the moon",
                                  f"sings {i} songs about bread and butter loudly", "sits."],
                      "label": i % 4})
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    return items


def test_hellaswag_figures_equal_brute_force_transformers(hf_folder, tmp_path, capsys):
    """--tasks hellaswag: acc (summed loss), acc_norm (per character, lm-eval's) and
    acc_norm_tokens (mean token loss, llm.c's) against transformers, written out."""
    import tiktoken

    folder, hf = hf_folder
    items = write_hellaswag(tmp_path / "hs.jsonl")
    enc = tiktoken.get_encoding("gpt2")
    expected = {"acc": [], "acc_norm": [], "acc_norm_tokens": []}
    for item in items:
        sums, chars, means = [], [], []
        for ending in item["endings"]:
            ctx, end = enc.encode_ordinary(item["ctx"]), enc.encode_ordinary(" " + ending)  # as llm.c encodes
            tokens = (ctx + end)[-17:]  # the block is 16: at most 17 tokens
            n_end = min(len(end), len(tokens) - 1)
            with torch.no_grad():
                logits = hf(torch.tensor(tokens[:-1])[None]).logits[0]
            losses = F.cross_entropy(logits, torch.tensor(tokens[1:]), reduction="none")[-n_end:]
            sums.append(losses.sum().item())
            chars.append(losses.sum().item() / len(ending))
            means.append(losses.mean().item())
        for name, values in (("acc", sums), ("acc_norm", chars), ("acc_norm_tokens", means)):
            expected[name].append(min(range(4), key=values.__getitem__) == item["label"])
    out = run_json(["--init_from", str(folder), "--tasks", "hellaswag", "--task_file",
                    f"hellaswag={tmp_path / 'hs.jsonl'}"], capsys)
    line = out["models"][0]["tasks"]["tasks"][0]
    assert line["items"] == len(items) and line["metric"] == "acc_norm"
    for name, right in expected.items():
        assert line[name] == sum(right) / len(items), name


def test_the_hellaswag_flag_is_gone_and_says_where_it_went(capsys):
    assert exit_code(["run", "--hellaswag", "download"]) == 2
    err = capsys.readouterr().err
    assert "--tasks hellaswag" in err and "--task_file hellaswag=FILE" in err and len(err.splitlines()) == 1


@pytest.fixture
def trained(tmp_path):
    """Two tiny runs on a char dataset, their val loss from train.py's eval_iters=0."""
    data_dir = tmp_path / "data"
    write_char_dataset(data_dir, text=sample_text(20_000))
    runs = []
    for name, iters in (("run-a", 4), ("run-b", 8)):
        out = tmp_path / name
        assert train.main(tiny_args(data_dir, out, max_iters=iters, eval_interval=iters, eval_iters=0, dropout=0.0)) == 0
        runs.append(out)
    return data_dir, runs


def test_val_loss_equals_train_py_and_a_table_compares_runs(trained, capsys):
    data_dir, runs = trained
    out = run_json([str(runs[0] / "ckpt.pt"), str(runs[1]), "--dataset", "tiny", "--data_dir", str(data_dir)], capsys)
    for row, run in zip(out["models"], runs):
        ckpt = load_checkpoint(run / "ckpt.pt")
        assert row["loss"] == pytest.approx(ckpt["val_loss"], abs=1e-5)
        assert row["tokens"] == ckpt_val_tokens(data_dir) - 1
        assert row["tokens_seen"] == ckpt["iter_num"] * 4 * 32 * 2
        assert row["bpb"] == pytest.approx(row["loss"] / math.log(2))  # ASCII: one byte a token
    assert eval_script.main([str(r) for r in runs] + ["--dataset", "tiny", "--data_dir", str(data_dir), "--device", "cpu"]) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    assert len(table) == 4 and "run-b" in table[3] and "bpb" in table[0]


def ckpt_val_tokens(data_dir):
    return json.loads((data_dir / "tiny" / "meta.json").read_text())["num_tokens"]["val"]


def test_max_tokens_and_input_forms(trained, tmp_path, capsys):
    data_dir, runs = trained
    text = sample_text(3000)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text(text[:1000])
    (tmp_path / "docs" / "b.txt").write_text(text[1000:3000])
    (tmp_path / "docs.jsonl").write_text(json.dumps({"text": text[:1000]}) + "\n" + json.dumps({"text": text[1000:3000]}) + "\n")
    folder = run_json([str(runs[1]), "--input", str(tmp_path / "docs")], capsys)["models"][0]
    jsonl = run_json([str(runs[1]), "--input", str(tmp_path / "docs.jsonl")], capsys)["models"][0]
    assert folder["tokens"] == jsonl["tokens"] == 3000 - 2  # each document's first token is context only
    assert folder["loss"] == pytest.approx(jsonl["loss"], rel=1e-6)
    capped = run_json([str(runs[1]), "--dataset", "tiny", "--data_dir", str(data_dir), "--max_tokens", "100"], capsys)
    assert capped["models"][0]["tokens"] == 99


def test_bad_inputs_exit_2_with_the_reason(trained, tmp_path, capsys):
    data_dir, runs = trained
    run = str(runs[0])
    (tmp_path / "short.txt").write_text("a")
    assert exit_code([run, "--input", str(tmp_path / "short.txt")]) == 2
    err = capsys.readouterr().err
    assert "1 token(s) long" in err and len(err.splitlines()) == 1  # the error is the only line
    (tmp_path / "odd.txt").write_text("Hello 東京 ∑ ∑")
    assert exit_code([run, "--input", str(tmp_path / "odd.txt")]) == 2
    err = capsys.readouterr().err
    assert "3 character(s) outside" in err and "'東'" in err and "run-a" in err and len(err.splitlines()) == 1
    lines = [json.dumps({"ctx": "He", "endings": ["a", "b", "c", "d"], "label": 0}), '{"ctx": "x", "endings": ["a"]}']
    (tmp_path / "hs.jsonl").write_text("\n".join(lines) + "\n")
    assert exit_code([run, "--tasks", "hellaswag", "--task_file", f"hellaswag={tmp_path / 'hs.jsonl'}"]) == 2
    assert "hs.jsonl, line 2" in capsys.readouterr().err
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes((runs[0] / "ckpt.pt").read_bytes()[:5000])
    assert exit_code([str(damaged), "--dataset", "tiny", "--data_dir", str(data_dir)]) == 2
    assert "damaged.pt" in capsys.readouterr().err
    assert exit_code([run]) == 2  # nothing to score
    assert "--input PATH" in capsys.readouterr().err
