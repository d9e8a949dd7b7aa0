"""A learner's edit to model.py always takes effect: the CPU fast paths that stand in for
model.py's code (gptkit/cpu_decode.py's one-token step, gptkit/fused.py's RMSNorm and
ReLU²) check themselves against it on the run's own model, fall back with one line
where they differ, and are named in the header where they agree.

Each case copies the tree, edits model.py as a learner would (the MLP, attention, RMSNorm,
each on its own), and in one process trains a few steps with the default kernels and
with --cpu_kernels model, and samples with the default decode and with --cpu_decode false:
the defaults must equal model.py's own path, and differ from the unedited tree's."""

import json
import shutil
import subprocess
import sys

import pytest

from repo import REPO

EDITS = {
    "mlp": ("        return self.dropout(self.c_proj(h))\n",
            "        return self.dropout(self.c_proj(h)) * 0.5\n"),
    "attention": ("        q, k, v = self.qkv(x, start)\n",
                  "        q, k, v = self.qkv(x, start)\n        q = q * 3.0  # scores scaled\n"),
    "rmsnorm": ("        y = F.rms_norm(x, (x.size(-1),), self.weight, NORM_EPS)\n",
                "        y = 0.5 * F.rms_norm(x, (x.size(-1),), self.weight, NORM_EPS)\n"),
}

# Edits to both fused modules' formulas that a probe of one small input in evaluation
# mode missed: ReLU² changed for large inputs only, RMSNorm in training mode only.
FUSED_EDITS = [
    ("        return F.relu(h).square()\n", "        return F.relu(h).clamp(max=3.5).square()\n"),
    ("        y = F.rms_norm(x, (x.size(-1),), self.weight, NORM_EPS)\n",
     "        y = F.rms_norm(x, (x.size(-1),), self.weight, NORM_EPS)\n        y = y * 1.5 if self.training else y\n"),
]

# Run inside a tree: train twice, sample twice, print what happened as one JSON line.
PROBE = r"""
import contextlib, io, json, sys
import sample, train
data, out, sampling = sys.argv[1], sys.argv[2], sys.argv[3] == "sample"
common = ["--dataset=tiny", f"--data_dir={data}", "--n_layer=2", "--n_head=2", "--n_embd=32",
          "--block_size=32", "--batch_size=4", "--gradient_accumulation_steps=1", "--max_iters=4",
          "--eval_interval=4", "--eval_iters=1", "--log_interval=1", "--compile=false", "--device=cpu",
          "--dtype=float32", "--norm=rmsnorm", "--mlp=relu2", "--pos_encoding=learned",
          "--learning_rate=1e-2", "--warmup_iters=0", "--progress_bar=false"]
result = {}
for kernels in ("fused", "model"):
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert train.main(common + [f"--out_dir={out}-{kernels}", f"--cpu_kernels={kernels}"]) == 0
    rows = [json.loads(line) for line in open(f"{out}-{kernels}/metrics.jsonl")]
    result[kernels] = {"losses": [r["loss"] for r in rows if "loss" in r], "log": printed.getvalue()}
for decode in ("true", "false") if sampling else ():
    text, said = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(said):
        assert sample.main([f"--out_dir={out}-fused", "--start=ab", "--num_samples=1",
                            "--max_new_tokens=24", "--seed=1", f"--cpu_decode={decode}"]) == 0
    result["decode_" + decode] = {"text": text.getvalue(), "stderr": said.getvalue()}
print(json.dumps(result))
"""


def beside_the_code(folder, names):
    """What a copy of the tree leaves out: git's files, caches, data and runs at the root."""
    at_root = folder == str(REPO)
    return [n for n in names if n in ("__pycache__", ".pytest_cache")
            or at_root and (n in (".git", "data") or n.startswith("out-"))]


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("fast-paths")
    text = root / "tiny.txt"
    text.write_text("".join(f"the {w} and the {w[::-1]} sat on a mat. " for w in
                            ("cat", "dog", "bird", "fish", "horse", "mouse") * 60))
    cmd = [sys.executable, "prepare.py", "--input", str(text), "--tokenizer", "char", "--name", "tiny",
           "--out_dir", str(root / "data")]
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, timeout=120)
    return root


def probe(tree, root, name, sampling=True):
    result = subprocess.run([sys.executable, "-c", PROBE, str(root / "data"), str(root / f"out-{name}"),
                             "sample" if sampling else "train"],
                            cwd=tree, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def unedited(tiny_data):
    return probe(REPO, tiny_data, "unedited")


def test_unedited_the_fast_paths_run_and_are_named(unedited):
    assert "kernels gptkit/fused.py (RMSNorm, ReLU² backward by hand, checked against model.py" in unedited["fused"]["log"]
    assert "does not match" not in unedited["fused"]["log"]
    said = unedited["decode_true"]["stderr"]
    assert "decode: gptkit/cpu_decode.py (NumPy one-token step, checked against model.py" in said
    assert "does not match" not in said
    assert "decode: model.py's forward" in unedited["decode_false"]["stderr"]
    assert unedited["decode_true"]["text"] == unedited["decode_false"]["text"]
    assert unedited["fused"]["losses"] == pytest.approx(unedited["model"]["losses"], abs=1e-5)


def edited_tree(tmp_path, *edits):
    tree = tmp_path / "tree"
    shutil.copytree(REPO, tree, ignore=beside_the_code)
    source = (tree / "model.py").read_text()
    for old, new in edits:
        assert source.count(old) == 1
        source = source.replace(old, new)
    (tree / "model.py").write_text(source)
    return tree


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_an_edit_to_model_py_is_what_trains_and_samples(edit, tiny_data, unedited, tmp_path):
    got = probe(edited_tree(tmp_path, EDITS[edit]), tiny_data, edit)
    # training follows the edit, whichever kernels were asked for
    assert got["fused"]["losses"] == pytest.approx(got["model"]["losses"], abs=1e-5)
    assert got["fused"]["losses"] != pytest.approx(unedited["fused"]["losses"], abs=1e-5)
    if edit == "rmsnorm":  # the one fused module this edit touches: it fell back, and said so
        assert "kernels: gptkit/fused.py's RMSNorm does not match model.py's" in got["fused"]["log"]
        assert "kernels gptkit/fused.py (ReLU² backward by hand" in got["fused"]["log"]
    # sampling follows it: the default decode falls back to model.py with one line
    said = got["decode_true"]["stderr"].splitlines()
    fallback = [line for line in said if "does not match" in line]
    assert len(fallback) == 1 and fallback[0].startswith("decode: gptkit/cpu_decode.py does not match model.py")
    assert got["decode_true"]["text"] == got["decode_false"]["text"]


def test_edits_to_the_fused_formulas_for_some_inputs_or_in_training_only_fall_back_named(tiny_data, unedited,
                                                                                          tmp_path):
    """The self-check probes training and evaluation mode at scales from 1e-4 to 1e4: each
    fused module an edit touches falls back with one line naming it, and the default run
    trains what --cpu_kernels model trains (the other, unedited kinds stay fused: the
    rmsnorm case above)."""
    got = probe(edited_tree(tmp_path, *FUSED_EDITS), tiny_data, "fused-edits", sampling=False)
    log = got["fused"]["log"]
    fallback = [line for line in log.splitlines() if "does not match" in line]
    assert len(fallback) == 2, log
    for line, kind, why in zip(fallback, ("RMSNorm", "ReLU2"), ("in training mode", "of scale 10")):
        assert line.startswith(f"kernels: gptkit/fused.py's {kind} does not match model.py's ("), line
        assert why in line and line.endswith(f"): model.py's {kind} runs"), line
    assert "kernels model.py" in log
    assert got["fused"]["losses"] == pytest.approx(got["model"]["losses"], abs=1e-5)
    # RMSNorm scaled in training: the run trains the edit (the tiny run's h stays below 3.5)
    assert got["fused"]["losses"] != pytest.approx(unedited["fused"]["losses"], abs=1e-5)
