"""lab.py: its stages are the model's attention, the mask behaves as the chapter says,
and the √d_k numbers match theory."""

import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from gptkit.ops.errors import UserError, run_main
import lab
from repo import REPO



@pytest.fixture(scope="module")
def toy():
    return lab.make_toy()


def test_toy_is_the_chapters_five_words_at_width_four(toy):
    assert toy.words == ["the", "cat", "sat", "on", "mat"]
    assert toy.x.shape == (1, 5, 4)
    assert toy.attn.c_attn.weight.shape == (12, 4)
    assert toy.attn.c_attn.bias is None


def test_toy_is_seeded_and_leaves_global_rng_alone(toy):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    again = lab.make_toy()
    assert torch.equal(torch.rand(3), expected)
    assert torch.equal(again.x, toy.x)
    assert torch.equal(again.attn.c_attn.weight, toy.attn.c_attn.weight)
    other = lab.make_toy(seed=1)
    assert not torch.equal(other.attn.c_attn.weight, toy.attn.c_attn.weight)


def test_qkv_stage_is_the_c_attn_projection(toy):
    s = lab.compute_stages(toy)
    W = toy.attn.c_attn.weight  # (3C, C): rows 0..3 make q, 4..7 k, 8..11 v
    x = toy.x[0]
    torch.testing.assert_close(s["q"], x @ W[0:4].T)
    torch.testing.assert_close(s["k"], x @ W[4:8].T)
    torch.testing.assert_close(s["v"], x @ W[8:12].T)


@pytest.mark.parametrize("causal", [True, False])
def test_stages_equal_torch_attention_on_the_same_weights(toy, causal):
    s = lab.compute_stages(toy, causal=causal)
    q, k, v = (s[n][None, None] for n in ("q", "k", "v"))  # (1, 1, T, D)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)[0, 0]
    torch.testing.assert_close(s["output"], expected)
    torch.testing.assert_close(s["scores"], s["q"] @ s["k"].T)
    torch.testing.assert_close(s["output"], s["weights"] @ s["v"])


def test_stage_five_then_c_proj_is_the_models_forward(toy):
    s = lab.compute_stages(toy, causal=True)
    with torch.no_grad():
        forward = toy.attn(toy.x)[0]  # (T, C): the model's own path, whatever kernel it uses
        via_lab = toy.attn.c_proj(s["output"])
    torch.testing.assert_close(via_lab, forward)


def test_mask_on_first_row_is_exactly_one_hot_and_rows_sum_to_one(toy):
    s = lab.compute_stages(toy, causal=True)
    w = s["weights"]
    assert w[0].tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]
    torch.testing.assert_close(w.sum(-1), torch.ones(5))
    upper = torch.triu(torch.ones(5, 5, dtype=torch.bool), diagonal=1)
    assert torch.all(w[upper] == 0)
    assert torch.all(s["scaled"][upper] == float("-inf"))
    assert torch.all(torch.isfinite(s["scaled"][~upper]))


def test_mask_off_upper_triangle_is_nonzero_and_rows_reshuffle(toy):
    on = lab.compute_stages(toy, causal=True)
    off = lab.compute_stages(toy, causal=False)
    upper = torch.triu(torch.ones(5, 5, dtype=torch.bool), diagonal=1)
    assert torch.all(off["weights"][upper] > 0)
    assert torch.all(torch.isfinite(off["scaled"]))
    torch.testing.assert_close(off["weights"].sum(-1), torch.ones(5))
    torch.testing.assert_close(on["scores"], off["scores"])  # the mask acts after stage 2
    assert not torch.allclose(on["weights"][:4], off["weights"][:4])
    torch.testing.assert_close(on["weights"][4], off["weights"][4])  # last row saw everything already


def test_scaled_stage_divides_by_sqrt_dk(toy):
    s = lab.compute_stages(toy, causal=False)
    torch.testing.assert_close(s["scaled"], s["scores"] / 2.0)  # √4


def test_no_interactive_prints_every_stage_with_and_without_mask(capsys):
    assert lab.main(["--no-interactive"]) == 0
    out = capsys.readouterr().out
    for i in range(1, 6):
        assert out.count(f"stage {i}/5") == 2
    assert out.count("causal mask ON") == 5 and out.count("causal mask OFF") == 5
    assert "-inf" in out
    assert "'the' can only attend to itself" in out
    assert "row sums: 1.00, 1.00, 1.00, 1.00, 1.00" in out
    assert "Q·Kᵀ" in out and "√d_k" in out and "softmax" in out


def test_no_interactive_takes_underscores_as_every_other_flag(capsys):
    lab.main(["--no-interactive"])  # the older spelling, kept for scripts
    hyphen = capsys.readouterr().out
    assert lab.main(["--no_interactive"]) == 0
    assert capsys.readouterr().out == hyphen and "softmax" in hyphen.lower()


def test_printed_weights_match_the_computed_ones(toy):
    lines = []
    lab.print_all(toy, write=lines.append)
    text = "\n".join(lines)
    for causal in (True, False):
        s = lab.compute_stages(toy, causal=causal)
        row = "the " + "".join(f"{v:7.2f}" for v in s["weights"][0].tolist())
        assert row in text
    assert "the    1.00   0.00   0.00   0.00   0.00" in text


def test_custom_text_labels_rows_and_columns(capsys):
    lab.main(["--no-interactive", "--text", "a b c"])
    out = capsys.readouterr().out
    assert "      a      b      c" in out


@pytest.mark.parametrize("text", ["", "one two three four five six seven eight nine"])
def test_bad_text_is_a_user_error(text):
    with pytest.raises(UserError, match="between 1 and 8 words"):
        lab.make_toy(text)


def test_walk_keys_next_mask_back_quit(toy):
    out = []
    lab.walk(toy, iter(["", "", "m", "", "zz", "b", "q", ""]), write=out.append)
    stages = [o.split("·")[0] for o in out if o.startswith("── stage")]
    assert stages == ["── stage 1/5 ", "── stage 2/5 ", "── stage 3/5 ", "── stage 3/5 ",
                      "── stage 4/5 ", "── stage 3/5 "]
    screens = [o for o in out if o.startswith("── stage")]
    assert "causal mask ON" in screens[2] and "-inf" in screens[2]
    assert "causal mask OFF" in screens[3] and "-inf" not in screens[3]
    assert any("unknown key 'zz'" in o for o in out)
    assert out[-1] == screens[-1]  # 'q' stopped it before the trailing ''


def test_walk_ends_after_the_last_stage(toy):
    out = []
    lab.walk(toy, iter([""] * 10), write=out.append)
    assert sum(o.startswith("── stage") for o in out) == 5
    assert out[-1] == "That was the last stage."


def test_piped_stdin_drives_the_script():
    result = subprocess.run(
        [sys.executable, "lab.py"], input="\n\n\nm\nq\n", capture_output=True, text=True,
        cwd=REPO, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "stage 4/5 · softmax weights · causal mask OFF" in result.stdout
    assert "Traceback" not in result.stderr


def test_bad_text_exits_2_with_a_message(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_main(lab.main, ["--text", "", "--no-interactive"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith("error: --text needs between 1 and 8 words")


@pytest.mark.parametrize("seed", [2**64 + 1, 2**63, -1])
@pytest.mark.parametrize("mode", ["--no_interactive", "--scaling"])
def test_a_seed_outside_torchs_range_exits_2_in_one_line(seed, mode, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_main(lab.main, [f"--seed={seed}", mode])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"error: --seed must be between 0 and 2**63 - 1, got {seed}\n"


def test_the_largest_seed_runs(capsys):
    assert lab.main([f"--seed={2**63 - 1}", "--no_interactive"]) == 0
    assert "stage 5/5" in capsys.readouterr().out


# ---- √d_k ----------------------------------------------------------------------------


@pytest.mark.parametrize("d_k", [4, 64, 128])
def test_raw_dot_product_variance_is_d_k(d_k):
    r = lab.scaling_stats(d_k, samples=2048, T=16, seed=d_k)
    # For q, k with iid N(0,1) entries, s = q·k has E[s²] = d_k and E[s⁴] = 3d_k² + 6d_k,
    # so the sample variance of n independent s has standard error √((2d_k² + 6d_k)/n).
    se = math.sqrt((2 * d_k**2 + 6 * d_k) / r["n"])
    assert r["n"] == 2048 * 16
    assert abs(r["var_raw"] - d_k) < 5 * se, (r["var_raw"], d_k, se)
    # delta method: se(std/√d_k) ≈ se(var) / (2·d_k)
    assert abs(r["std_scaled"] - 1.0) < 5 * se / (2 * d_k)
    assert r["std_raw"] == pytest.approx(math.sqrt(d_k), rel=0.03)


def test_unscaled_softmax_saturates_as_d_k_grows_and_scaling_prevents_it():
    rows = {d: lab.scaling_stats(d, samples=512, T=16) for d in (4, 64, 128)}
    raw = [rows[d]["max_weight_raw"] for d in (4, 64, 128)]
    assert raw[0] < raw[1] < raw[2]
    assert rows[128]["max_weight_raw"] > 0.8 and rows[128]["entropy_raw"] < 0.5
    assert rows[128]["saturated_raw"] > 0.3
    for d in (4, 64, 128):
        # scaled, every width sees scores of std 1 over T=16 keys: far from one-hot
        assert rows[d]["max_weight_scaled"] < 0.35
        assert rows[d]["entropy_scaled"] > 2.2  # log 16 = 2.77
        assert rows[d]["saturated_scaled"] < 0.01


def test_scaling_mode_prints_the_table(capsys):
    assert lab.main(["--scaling", "--samples", "256"]) == 0
    out = capsys.readouterr().out
    lines = [line.split() for line in out.splitlines()]
    by_dk = {int(parts[0]): parts for parts in lines if parts and parts[0] in ("4", "64", "128")}
    assert set(by_dk) == {4, 64, 128}
    assert float(by_dk[128][1]) == pytest.approx(11.31, abs=0.01)  # √128
    assert float(by_dk[128][2]) == pytest.approx(11.31, rel=0.05)
    assert float(by_dk[128][3]) == pytest.approx(1.0, rel=0.05)
    assert "Vaswani" in out


# ---- the chapter map names real functions ----------------------------------------------

CHAPTER_HEADING = "## Reading the code alongside the Transformer chapter"


def chapter_section():
    """The section's text from README.md."""
    from pathlib import Path

    text = (Path(REPO) / "README.md").read_text(encoding="utf-8")
    assert CHAPTER_HEADING in text, "README.md lost its chapter section"
    return text.split(CHAPTER_HEADING, 1)[1].split("\n## ", 1)[0]


def test_chapter_map_names_functions_that_exist():
    import importlib
    import re

    section = chapter_section()
    rows = [line for line in section.splitlines() if line.startswith("| ") and "`" in line]
    assert len(rows) >= 12
    checked = 0
    for row in rows:
        where = row.split("|")[2]
        for path, names in re.findall(r"`([\w/]+)\.py`: ((?:`[\w.]+`(?:, )?)+)", where):
            module_name = path.replace("/", ".")  # gptkit/train/muon.py -> gptkit.train.muon
            module = importlib.import_module(module_name)
            for dotted in re.findall(r"`([\w.]+)`", names):
                obj = module
                for part in dotted.split("."):
                    assert hasattr(obj, part), f"{module_name}.py has no {dotted} (chapter map: {row})"
                    obj = getattr(obj, part)
                checked += 1
    assert checked >= 20
