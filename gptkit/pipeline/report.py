"""report.md: what every stage of a pipeline run cost and bought, from its done-markers.

Every figure is copied from a marker, and each marker's figures were read from what
the stage's own commands printed (gptkit/pipeline/stages.py): the report computes
nothing, so it cannot disagree with the logs beside it.
"""

import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path

from gptkit.ops.atomic import atomic_write
from gptkit.pipeline.runner import format_duration


def cpu_model():
    """(the CPU's name, its widest vector extension: AVX-512, AVX2 or neither), from /proc/cpuinfo."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine(), "unknown"
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")),
                platform.machine())
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    vector = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "neither AVX2 nor AVX-512"
    return name, vector


def git_commit(repo):
    """The repository's commit, with '(modified)' when the tree differs from it; 'unknown' outside git."""
    try:
        commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (commit + (" (modified)" if dirty else "")) if commit else "unknown"


def machine(repo):
    import os

    name, vector = cpu_model()
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "not installed"
    return [("CPU", f"{name}, {os.cpu_count()} logical cores, {vector}"), ("OS", platform.platform()),
            ("Python", platform.python_version()), ("torch", torch_version), ("git commit", git_commit(repo))]


def fmt(value, digits=4):
    return "n/a" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def percent(value):
    return "n/a" if value is None else f"{100 * value:.1f}%"


def headline(stage, figures):
    """The figures a stage bought, in a few words, for the stages table."""
    if stage in ("pretrain", "sft"):
        bpb = f", val bpb {fmt(figures['val_bpb'])}" if "val_bpb" in figures else ""
        return (f"{figures['iterations']} iterations: train loss {fmt(figures['train_loss'])}, "
                f"val loss {fmt(figures['val_loss'])}{bpb}")
    if stage in ("card", "card_after"):
        card = figures["card"]
        summary = "n/a" if "n/a" in card else percent(card["summary"])
        return f"val loss {fmt(figures['val_loss'])}, val bpb {fmt(figures['val_bpb'])}; card summary {summary}"
    if stage == "rl":
        return (f"{figures['steps']} steps: exact match {percent(figures['exact_match_before'])} → "
                f"{percent(figures['exact_match_after'])}")
    if stage in ("corpus", "chat_data"):
        vocab = f"BPE of {figures['vocab_size']:,} ids; " if "vocab_size" in figures else ""
        talks = (f" ({figures['train_conversations']:,} / {figures['val_conversations']:,} conversations)"
                 if "train_conversations" in figures else "")
        return f"{vocab}train {figures['train_tokens']:,} tokens, val {figures['val_tokens']:,}{talks}"
    if stage == "export":
        return f"hf/ ({figures['hf_bytes'] / 1e6:,.1f} MB), {figures['gguf']} ({figures['gguf_bytes'] / 1e6:,.1f} MB)"
    return "loss.png" if figures.get("plot") else "no plot (eval.py plot needs matplotlib)"


def with_stderr(task, key):
    """A task's figure, with its standard error where eval.py's card gives one."""
    value = task.get(key)
    err = task.get(f"{key}_stderr", task.get("stderr") if key == task.get("metric") else None)
    return percent(value) + (f" ± {100 * err:.1f}" if isinstance(err, float) else "")


def card_section(before, after):
    """The report card before and after, task by task (or why it is n/a)."""
    lines = ["## Report card", ""]
    cards = [("pretrained", before), ("chat, after RL", after)]
    for label, card in cards:
        if card is not None and "n/a" in card:
            lines.append(f"- {label}: n/a ({card['n/a']})")
    scored = [(label, card) for label, card in cards if card is not None and "n/a" not in card]
    if not scored:
        return lines + [""]
    lines += ["", "| task | metric | random | " + " | ".join(f"{label} items | {label} acc" for label, _ in scored) + " |",
              "|---|---|---|" + "---|---|" * len(scored)]
    for i, task in enumerate(scored[0][1]["tasks"]):
        cells = []
        for _, card in scored:
            other = card["tasks"][i]
            cells += [str(other["items"]), with_stderr(other, other["metric"])]
        lines.append(f"| {task['title']} | {task['metric']} | {percent(task['random'])} | " + " | ".join(cells) + " |")
    summaries = []
    for _, card in scored:
        err = card.get("summary_stderr")
        summaries += ["", f"**{percent(card['summary'])}**" + (f" ± {100 * err:.1f}" if isinstance(err, float) else "")]
    lines.append("| **summary** | mean centered | | " + " | ".join(summaries) + " |")
    return lines + ["", "centered accuracy = (acc - random) / (1 - random), averaged over the tasks; ± is one "
                    "standard error, in points, as eval.py gives it (docs/evaluation.md in the repository).", ""]


def write_report(run, stages, markers, settings, serve):
    """RUN/report.md from the markers of `stages` (in order); returns its path."""
    m = {name: marker["figures"] for name, marker in markers.items()}
    total_wall = sum(marker["wall_s"] for marker in markers.values())
    total_cpu = sum(marker["cpu_s"] for marker in markers.values())
    lines = [f"# Pipeline run: {run.folder.name}", "",
             f"Size **{settings['size']}**, corpus **{settings['corpus']}**, finished "
             f"{max(marker['finished'] for marker in markers.values())}: "
             f"{format_duration(total_wall)} wall, {format_duration(total_cpu)} CPU over {len(markers)} stages.", "",
             "## Headline", "", "| figure | value |", "|---|---|"]
    pre, card, card_after, rl = m.get("pretrain", {}), m.get("card", {}), m.get("card_after", {}), m.get("rl", {})
    rows = [("pretraining: train / val loss (train.py's last estimate)",
             f"{fmt(pre.get('train_loss'))} / {fmt(pre.get('val_loss'))}"),
            (f"pretraining: val loss / bits per byte (eval.py, {card.get('scored_tokens', 0):,} val tokens)",
             f"{fmt(card.get('val_loss'))} / {fmt(card.get('val_bpb'))}"),
            ("report card, pretrained (mean centered accuracy)", summary_of(card)),
            ("report card, chat model after RL", summary_of(card_after)),
            (f"chat exact match, held-out sums ({rl.get('eval_prompts', 'n/a')} prompts), before RL",
             percent(rl.get("exact_match_before"))),
            ("chat exact match, held-out sums, after RL", percent(rl.get("exact_match_after")))]
    lines += [f"| {name} | {value} |" for name, value in rows]
    lines += ["", "## Stages", "", "| # | stage | wall | CPU | peak memory | figures |", "|---|---|---|---|---|---|"]
    for number, stage in enumerate(stages, 1):
        marker = markers[stage.name]
        tries = f" ({marker['attempts']} tries)" if marker["attempts"] > 1 else ""
        lines.append(f"| {number} | {stage.title}{tries} | {format_duration(marker['wall_s'])} | "
                     f"{format_duration(marker['cpu_s'])} | {marker['peak_rss_mb']:,.0f} MB | "
                     f"{headline(stage.name, marker['figures'])} |")
    lines += ["", "Wall and CPU time and peak memory (the largest resident set of the stage's processes) "
              "are each stage's commands', from os.wait4; a stage that was interrupted adds the time of "
              "every try. The commands, as run (their output is in `logs/`):", ""]
    for number, stage in enumerate(stages, 1):
        lines += [f"{number}. {stage.title} (`{markers[stage.name]['log']}`; resumes: {stage.resumes})", "",
                  "   ```bash", *[f"   {c}" for c in markers[stage.name]["commands"]], "   ```", ""]
    lines += card_section(card.get("card"), card_after.get("card"))
    if m.get("report", {}).get("plot"):
        lines += ["## Loss", "", "Training and validation loss of pretraining and chat SFT "
                  "(`eval.py plot`, from each run's `metrics.jsonl`):", "", "![loss curves](loss.png)", ""]
    lines += ["## Machine", "", "| | |", "|---|---|", *[f"| {k} | {v} |" for k, v in machine(Path(__file__).parents[2])],
              f"| report written | {time.strftime('%Y-%m-%d %H:%M:%S')} |", "",
              "## Serve it", "", "```bash", serve, "```", ""]
    path = run.folder / "report.md"
    with atomic_write(path) as tmp:
        tmp.write_text("\n".join(lines))
    return path


def summary_of(card_figures):
    card = card_figures.get("card")
    if card is None:
        return "n/a"
    if "n/a" in card:
        return "n/a (why: below)"
    err = card.get("summary_stderr")
    return percent(card["summary"]) + (f" ± {100 * err:.1f}" if isinstance(err, float) else "")
