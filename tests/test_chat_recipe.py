"""The offline chat recipe does what docs/chat.md says: configs/chat_arithmetic.py, trained on
arithmetic_chat (made here), answers sums it never saw answered. Half its steps, to keep the
suite short: 96.2% of the held-out replies exact at 300 steps, 100% at the recipe's 600
(benchmarks/LOG.md); the test asks for 90%. And the 200-step start of the RL recipes
sits where docs/rl.md says it does."""

import json
import subprocess
import sys

import pytest
import torch
from repo import REPO
from train_helpers import run_train_subprocess, subprocess_env

import eval as eval_script
import train


@pytest.mark.slow
def test_the_arithmetic_recipe_answers_held_out_sums(tmp_path, capsys):
    data, out = tmp_path / "data", tmp_path / "out"
    assert train.main([str(REPO / "configs" / "chat_arithmetic.py"), f"--data_dir={data}", f"--out_dir={out}", "--progress_bar=false",
                       "--max_iters=300"]) == 0
    capsys.readouterr()
    assert eval_script.main([str(out), f"--data_dir={data}", "--dataset=arithmetic_chat", "--exact_match",
                             "--json=-", "--no_progress"]) == 0
    scores = json.loads(capsys.readouterr().out)["models"][0]["exact_match"]
    single, multi = scores["single"], scores["multi"]
    assert single["replies"] == 3955 and single["rate"] >= 0.90, scores
    assert multi["rate"] >= single["rate"] - 0.05, scores  # a session answers as the eval says


# The 200-step start sits mid-climb (120 steps: 5% right, 300: 93%), where the rounding of
# torch's own CPU kernels moves it: AVX-512's give val loss 0.5326 and 43.5% pass@1, AVX2's
# 0.6300 and 24.5% (docs/rl.md). The test pins the AVX2 kernels, which every x86-64 CPU
# with AVX-512 or AVX2 runs alike, so its band holds on every such machine.
START_KERNELS = {"ATEN_CPU_CAPABILITY": "avx2"}
START_VAL_LOSS = (0.62, 0.64)  # docs/rl.md: 0.6300
START_PASS1 = (0.22, 0.27)  # docs/rl.md: 24.5% of 400 held-out sums


def records_of(out, kind):
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["kind"] == kind]


@pytest.mark.slow
@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"),
                    reason="the pinned figures are those of torch's AVX2 kernels")
def test_the_200_step_start_of_the_rl_recipes_is_in_the_docs_band(tmp_path):
    data, sft, rl = tmp_path / "data", tmp_path / "sft", tmp_path / "rl"
    done = run_train_subprocess([str(REPO / "configs" / "chat_arithmetic.py"), "--max_iters=200",
                                 f"--data_dir={data}", f"--out_dir={sft}", "--progress_bar=false"],
                                timeout=900, **START_KERNELS)
    assert done.returncode == 0, done.stderr
    val_loss = records_of(sft, "eval")[-1]["val_loss"]
    assert START_VAL_LOSS[0] <= val_loss <= START_VAL_LOSS[1], val_loss
    # rl.py's own measure of the start: its evaluation before the first step (one tiny step)
    done = subprocess.run([sys.executable, str(REPO / "rl.py"), str(REPO / "configs" / "rl_arithmetic.py"),
                           f"--init_from={sft}", f"--out_dir={rl}", "--max_iters=1", "--eval_interval=1",
                           "--prompts_per_step=1", "--group_size=2"],
                          cwd=REPO, env=subprocess_env(**START_KERNELS), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    start = records_of(rl, "rl_eval")[0]
    assert start["iter"] == 0 and START_PASS1[0] <= start["pass1"] <= START_PASS1[1], start


@pytest.mark.slow
def test_the_calculator_recipe_answers_held_out_products_only_with_its_tool(tmp_path, capsys):
    """configs/chat_multiply_tools.py at a fifth of its steps: products of two four-digit
    numbers never asked in training, answered through the calculator (2,000 of 2,000 at the
    recipe's 600 steps, 300 of 300 at 150: benchmarks/LOG.md); without it, none."""
    data, out = tmp_path / "data", tmp_path / "out"
    assert train.main([str(REPO / "configs" / "chat_multiply_tools.py"), f"--data_dir={data}", f"--out_dir={out}",
                       "--progress_bar=false", "--max_iters=120", "--eval_interval=120"]) == 0
    rates = {}
    for tools in ("calculator", "none"):
        capsys.readouterr()
        assert eval_script.main([str(out), f"--data_dir={data}", "--dataset=multiply_tools", "--answers", tools,
                                 "--limit=150", "--max_tokens=2", "--json=-", "--no_progress"]) == 0
        answers = json.loads(capsys.readouterr().out)["models"][0]["answers"]
        assert answers["questions"] == 150 and answers["tools"] == tools
        rates[tools] = answers["rate"]
    assert rates["calculator"] >= 0.90 and rates["none"] < 0.20, rates
