"""gptkit/evals/plot.py and `eval.py plot`: reads metrics.jsonl as train.py writes it and draws every run."""

import json
import sys

import pytest

from gptkit.ops.errors import UserError, run_main
import eval as eval_script
from gptkit.evals import plot

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_run(folder, n_iters=20, eval_every=5, base=4.0, extra=None, tail=""):
    """A metrics.jsonl shaped like train.py's, with a falling loss."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n_iters):
        row = {"kind": "train", "iter": i, "loss": base - 0.1 * i, "lr": 1e-3 * min(1, (i + 1) / 5),
               "grad_norm": 1.0, "ms_per_iter": 30.0, "tokens_per_s": 1000.0, "mfu": 0.1,
               "train_time_s": 0.03 * i}
        row.update(extra or {})
        lines.append(json.dumps(row))
        if i % eval_every == 0:
            lines.append(json.dumps({"kind": "eval", "iter": i, "train_loss": base - 0.1 * i,
                                     "val_loss": base + 0.1 - 0.1 * i, "lr": row["lr"],
                                     "train_time_s": row["train_time_s"]}))
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n" + tail)
    return folder


def test_reads_train_and_eval_rows(tmp_path):
    rows = plot.read_metrics(write_run(tmp_path / "run"))
    assert [r["iter"] for r in rows["train"]] == list(range(20))
    assert [r["iter"] for r in rows["eval"]] == [0, 5, 10, 15]
    assert rows["eval"][1]["val_loss"] == pytest.approx(3.6)


def test_truncated_last_line_and_unknown_keys_are_tolerated(tmp_path):
    run = write_run(tmp_path / "run", extra={"new_metric": 7}, tail='{"kind": "train", "iter": 20, "lo')
    rows = plot.read_metrics(run)
    assert len(rows["train"]) == 20
    with open(run / "metrics.jsonl", "a") as f:  # a kind we don't know is skipped too
        f.write('ss": 1}\n{"kind": "checkpoint", "iter": 20}\n')
    assert len(plot.read_metrics(run)["train"]) == 21


def test_corrupt_middle_line_names_file_and_line(tmp_path):
    run = write_run(tmp_path / "run", n_iters=3)
    text = (run / "metrics.jsonl").read_text().split("\n")
    text[1] = "{not json"
    (run / "metrics.jsonl").write_text("\n".join(text))
    with pytest.raises(UserError, match=r"metrics.jsonl, line 2 is not valid JSON"):
        plot.read_metrics(run)


def test_missing_folder_metrics_and_empty_file_are_named(tmp_path):
    with pytest.raises(UserError, match=r"run folder .*nope does not exist"):
        plot.read_metrics(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"empty/metrics.jsonl does not exist"):
        plot.read_metrics(tmp_path / "empty")
    (tmp_path / "empty" / "metrics.jsonl").write_text("")
    with pytest.raises(UserError, match="no metrics yet"):
        plot.read_metrics(tmp_path / "empty")


def test_figure_has_one_colour_per_run_and_the_data(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is optional; pip install matplotlib")
    a = plot.read_metrics(write_run(tmp_path / "a", base=4.0))
    b = plot.read_metrics(write_run(tmp_path / "b", base=3.0))
    fig = plot.loss_figure([("a", a), ("b", b)])
    ax_loss, ax_lr = fig.axes
    lines = {line.get_label(): line for line in ax_loss.get_lines()}
    assert set(lines) == {"a train", "a val", "b train", "b val"}
    assert list(lines["b val"].get_xdata()) == [0, 5, 10, 15]
    assert list(lines["b val"].get_ydata()) == pytest.approx([3.1, 2.6, 2.1, 1.6])
    assert lines["a train"].get_color() == lines["a val"].get_color()
    assert lines["a train"].get_color() != lines["b train"].get_color()
    lr = {line.get_label(): line for line in ax_lr.get_lines()}
    assert set(lr) == {"a", "b"} and max(lr["a"].get_ydata()) == pytest.approx(1e-3)
    legend = [t.get_text() for t in ax_loss.get_legend().get_texts()]
    assert "a val" in legend and "b train" in legend


def test_cli_writes_a_png(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="matplotlib is optional; pip install matplotlib")
    import matplotlib.image

    write_run(tmp_path / "out-a")
    write_run(tmp_path / "out-b", base=3.0)
    out = tmp_path / "cmp.png"
    assert eval_script.main(["plot", str(tmp_path / "out-a"), str(tmp_path / "out-b"), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == PNG_MAGIC
    assert matplotlib.image.imread(out).shape[0] > 100
    assert f"wrote {out}" in capsys.readouterr().out


def test_same_folder_names_are_told_apart():
    assert plot.run_labels(["x/out", "y/out", "z/run"]) == ["x/out", "y/out", "run"]


def test_missing_run_exits_2_naming_it(tmp_path, capsys):
    write_run(tmp_path / "good")
    with pytest.raises(SystemExit) as e:
        run_main(eval_script.main, ["plot", str(tmp_path / "good"), str(tmp_path / "typo")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: run folder") and "typo" in err


def test_missing_matplotlib_names_the_fix(tmp_path, monkeypatch):
    rows = plot.read_metrics(write_run(tmp_path / "a"))
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(UserError, match="pip install matplotlib"):
        plot.loss_figure([("a", rows)])


def test_default_png_goes_into_the_run_folder_not_the_cwd(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib", reason="matplotlib is optional; pip install matplotlib")
    write_run(tmp_path / "runs" / "out-a")
    monkeypatch.chdir(tmp_path)
    assert eval_script.main(["plot", str(tmp_path / "runs" / "out-a")]) == 0
    assert (tmp_path / "runs" / "out-a" / "loss.png").read_bytes()[:8] == PNG_MAGIC
    assert not (tmp_path / "loss.png").exists()


def add_bpb(folder, scale):
    """Give every eval row train_bpb / val_bpb, as train.py logs them (loss * scale)."""
    path = folder / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for r in rows:
        if r["kind"] == "eval":
            r["train_bpb"], r["val_bpb"] = r["train_loss"] * scale, r["val_loss"] * scale
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_bits_per_byte_is_the_default_when_every_run_has_it(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is optional; pip install matplotlib")
    char = add_bpb(write_run(tmp_path / "char", base=4.0), 1.44)
    bpe = add_bpb(write_run(tmp_path / "bpe", base=6.0), 0.5)
    old = write_run(tmp_path / "old", base=3.0)
    runs = [(d.name, plot.read_metrics(d)) for d in (char, bpe)]
    assert plot.choose_metric(runs) == "bpb"
    fig = plot.loss_figure(runs, "bpb")
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines["bpe val"].get_ydata()) == pytest.approx([3.05, 2.8, 2.55, 2.3])
    assert list(lines["char train"].get_xdata()) == [0, 5, 10, 15]  # from the eval rows
    assert ax.get_ylabel() == "bits per byte"
    mixed = runs + [("old", plot.read_metrics(old))]
    assert plot.choose_metric(mixed) == "loss"  # nats/token for all rather than two scales on one axis
    with pytest.raises(UserError, match="old logged no val_bpb"):
        plot.choose_metric(mixed, "bpb")
    with pytest.raises(UserError, match="--metric must be"):
        plot.choose_metric(runs, "bits")
    out = tmp_path / "b.png"
    assert eval_script.main(["plot", str(char), str(bpe), "--metric", "bpb", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == PNG_MAGIC
