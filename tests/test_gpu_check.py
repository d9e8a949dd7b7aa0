"""scripts/gpu_check.sh, read and run on a CPU: it goes on after a failing step (no
`set -e`), its steps' timeouts add up to at most 8 minutes, it ends with a summary
table, and its bash parses."""

import os
import re
import subprocess

import pytest
import torch

from repo import REPO

SCRIPT = REPO / "scripts" / "gpu_check.sh"
BUDGET_S = 480  # the 8 minutes the script promises


def script_lines():
    """The script's lines without comments."""
    return [line.split("#")[0].rstrip() if not line.lstrip().startswith("#") else "" for line in SCRIPT.read_text().splitlines()]


def steps():
    """(name, timeout in seconds) of every `step NAME SECONDS ...` call."""
    return [(m.group(1), int(m.group(2))) for line in script_lines() if (m := re.match(r"step (\w+) (\d+) ", line))]


def test_no_errexit_so_every_step_runs():
    code = "\n".join(script_lines())
    assert not re.search(r"^\s*set\s+-\w*e", code, re.M) and "errexit" not in code


def test_the_steps_timeouts_add_up_to_at_most_8_minutes():
    names = [name for name, _ in steps()]
    assert names == ["cuda", "training", "kernels", "parallel", "speed"]
    assert sum(limit for _, limit in steps()) <= BUDGET_S
    # Nothing runs outside a step (and so outside its timeout), and the one timeout call is the step's own.
    bare = [line for line in script_lines() if re.match(r"\s*(python|torchrun|timeout|bash)\b", line)]
    assert bare == ['    timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1'], bare


def test_it_ends_with_a_summary_table_and_parses():
    text = SCRIPT.read_text()
    assert "| step | result | seconds |" in text and text.rstrip().endswith('exit "$failed"')
    result = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine this would run the real checks")
def test_on_a_cpu_every_step_runs_fails_and_is_in_the_summary(tmp_path):
    """No GPU here: the first step fails, and every later one still runs (and fails:
    the GPU tests refuse to be skipped under the script, the benchmark asks for cuda)."""
    result = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=BUDGET_S,
                            env={**os.environ, "GPU_CHECK_LOGS": str(tmp_path)})
    rows = [line for line in result.stdout.splitlines() if re.match(r"\| \w+ \| (pass|FAIL|TIMEOUT)", line)]
    assert [row.split(" | ")[0][2:] for row in rows] == [name for name, _ in steps()], result.stdout[-3000:]
    assert all("FAIL" in row for row in rows), rows
    assert result.returncode == len(rows)
    assert "GPTKIT_GPU_CHECK is set but torch sees no CUDA device" in (tmp_path / "training.log").read_text()
    assert "sees no CUDA GPU" in (tmp_path / "speed.log").read_text()
