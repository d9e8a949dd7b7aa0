"""pipeline.py: the tiny size end to end, stopped twice (inside pretraining, then between
stages) and resumed; finished stages are never run again, and report.md's figures are
the ones the stages' own logs and JSON files hold."""

import io
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from repo import REPO, SHAKESPEARE, reset_sigint
from task_files import write_task

from gptkit.ops.errors import UserError
from gptkit.pipeline import runner
from gptkit.pipeline.stages import STAGES

TASKS = ("arc_easy", "piqa")


def pipeline_command(run, tasks):
    files = [f"--task_file={name}={path}" for name, path in tasks.items()]
    return [sys.executable, str(REPO / "pipeline.py"), "--size=tiny", f"--out_dir={run}",
            f"--tasks={','.join(tasks)}", *files]


def environment():
    # Tiny Shakespeare from its local copy; tiny models: one thread each is faster on shared cores.
    return dict(os.environ, TINYSHAKESPEARE=str(SHAKESPEARE), OMP_NUM_THREADS="1")


def interrupt_when(command, ready, out, timeout=300):
    """Start the pipeline, Ctrl-C it (SIGINT, as a terminal sends) once ready() holds; its exit code."""
    with open(out, "ab") as log:
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=environment(),
                                 preexec_fn=reset_sigint)
    deadline = time.monotonic() + timeout
    while not ready():
        assert child.poll() is None, f"the pipeline ended before the interruption: {out.read_text()[-2000:]}"
        assert time.monotonic() < deadline, "the pipeline never reached the point to interrupt"
        time.sleep(0.05)
    child.send_signal(signal.SIGINT)
    return child.wait(timeout=120)


def last(pattern, text):
    found = re.findall(pattern, text, re.M)
    assert found, f"{pattern!r} not found"
    return found[-1]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """The tiny size with two task files, Ctrl-C'd in pretraining and between stages, then finished."""
    if not SHAKESPEARE.is_file():
        pytest.skip(f"Tiny Shakespeare not found at {SHAKESPEARE} (set TINYSHAKESPEARE=path)")
    tmp = tmp_path_factory.mktemp("pipeline")
    tasks = {name: write_task(tmp / "tasks", name) for name in TASKS}
    run, out = tmp / "run", tmp / "console.txt"
    command = pipeline_command(run, tasks)
    pretrain_log = run / "logs" / "pretrain.log"
    in_training = interrupt_when(command, lambda: pretrain_log.is_file() and "step 5/" in pretrain_log.read_text(),
                                 out)
    between = interrupt_when(command, lambda: (run / "stages" / "chat_data.json").is_file(), out)
    snapshot = {p.name: p.read_text() for p in (run / "stages").glob("*.json") if "partial" not in p.name}
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=environment(), timeout=600)
    return {"run": run, "codes": (in_training, between, done.returncode), "console": out.read_text() + done.stdout,
            "final": done, "snapshot": snapshot, "tasks": tasks}


@pytest.mark.slow
def test_the_tiny_size_runs_every_stage_resuming_after_two_interruptions(tiny_run):
    run, final = tiny_run["run"], tiny_run["final"]
    assert tiny_run["codes"] == (130, 130, 0), final.stdout + final.stderr
    assert "interrupted during pretraining" in tiny_run["console"]
    for stage in STAGES:
        assert (run / "stages" / f"{stage.name}.json").is_file(), stage.name
    assert not list((run / "stages").glob("*.partial.json"))
    # The stage stopped inside resumed from its checkpoint, as train.py resumes.
    pretrain = json.loads((run / "stages" / "pretrain.json").read_text())
    assert pretrain["attempts"] == 2 and pretrain["commands"][-1].endswith("--init_from=resume")
    assert pretrain["commands"][0].endswith("--init_from=scratch --overwrite=true")  # the first try's, kept
    assert pretrain["figures"]["iterations"] == 20
    # Stages finished before the last run were not run again: their markers and logs are as they were.
    for name, text in tiny_run["snapshot"].items():
        assert (run / "stages" / name).read_text() == text, name
    for name in ("corpus", "chat_data"):
        assert (run / "logs" / f"{name}.log").read_text().count("=== ") == 1
    assert final.stdout.count("done before, skipped") == len(tiny_run["snapshot"])
    # What it made: the exports (transformers reads our BPE as we do), and the command that serves them.
    assert (run / "hf" / "tokenizer.json").is_file() and (run / "model.gguf").is_file()
    transformers = pytest.importorskip("transformers")
    from gptkit.data.dataset import load_meta
    from gptkit.data.tokenizer import tokenizer_from_dict

    ours = tokenizer_from_dict(load_meta(run / "data", "corpus")["tokenizer"])
    messages = [{"role": "user", "content": "What is 37+45?"}]
    hf = transformers.AutoTokenizer.from_pretrained(run / "hf")
    assert hf("ROMEO:\nWhat is 37+45?  82")["input_ids"] == ours.encode("ROMEO:\nWhat is 37+45?  82")
    prompt = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    assert list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt) == [
        ours.vocab_size + 1, *ours.encode("What is 37+45?"), ours.vocab_size + 3, ours.vocab_size + 2]
    assert f"serve.py --out_dir {run / 'rl'}" in final.stdout


@pytest.mark.slow
def test_the_report_holds_the_figures_of_the_stages_own_logs(tiny_run):
    run = tiny_run["run"]
    report = (run / "report.md").read_text()
    pretrain_log = (run / "logs" / "pretrain.log").read_text()
    train_loss, val_loss = last(r"^eval 20 \| train loss ([\d.]+) \| val loss ([\d.]+)", pretrain_log)
    assert f"| {float(train_loss):.4f} / {float(val_loss):.4f} |" in report
    sft_loss = last(r"^eval 10 \| train loss [\d.]+ \| val loss ([\d.]+)", (run / "logs" / "sft.log").read_text())
    assert f"val loss {float(sft_loss):.4f}" in report
    rl_log = (run / "logs" / "rl.log").read_text()
    before, after = (float(last(rf"^eval {step} \| pass1 ([\d.]+)", rl_log)) for step in (0, 2))
    assert f"before RL | {100 * before:.1f}% |" in report and f"after RL | {100 * after:.1f}% |" in report
    scored = json.loads((run / "card-pretrain-bpb.json").read_text())["models"][0]  # eval.py's own JSON
    assert f"{scored['loss']:.4f} / {scored['bpb']:.4f}" in report
    for card_file in ("card-pretrain.json", "card-final.json"):
        card = json.loads((run / card_file).read_text())["models"][0]["tasks"]
        assert f"**{100 * card['summary']:.1f}%" in report
        for task in card["tasks"]:
            err = f" ± {100 * task['stderr']:.1f}" if "stderr" in task else ""  # where eval.py gives one
            assert re.search(rf"\| {task['title']} \|.*\| {task['items']} \| {100 * task[task['metric']]:.1f}%{err} \|",
                             report)
    # Each stage's commands are the ones its log shows being run.
    for stage in STAGES:
        log = (run / "logs" / f"{stage.name}.log").read_text()
        for command in json.loads((run / "stages" / f"{stage.name}.json").read_text())["commands"]:
            assert f"$ {command}\n" in log and f"   {command}\n" in report
    assert "![loss curves](loss.png)" in report and (run / "loss.png").stat().st_size > 1000
    assert re.search(r"\| torch \| \d", report) and re.search(r"\| CPU \| .*(AVX|neither)", report)


def test_a_run_folder_keeps_its_settings_and_bad_choices_fail_before_any_stage(tmp_path):
    base = [sys.executable, str(REPO / "pipeline.py"), "--size=tiny", f"--out_dir={tmp_path / 'run'}"]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "pipeline.json").write_text(json.dumps({"size": "laptop"}))
    for args, message in ((["--tasks=none"], "holds a pipeline run with other settings"),
                          (["--corpus", str(tmp_path / "nothing")], "neither shakespeare"),
                          (["--task_file=arc_easy"], "expected NAME=PATH"),
                          (["--shards=2"], "--shards goes with a downloaded corpus")):
        result = subprocess.run(base + args, capture_output=True, text=True, cwd=tmp_path, timeout=60)
        assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr, args
        assert not {"stages", "logs", "data"} & {p.name for p in (tmp_path / "run").iterdir()}


def test_without_a_terminal_a_progress_line_comes_at_least_every_heartbeat(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(runner.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    progress = runner.Progress({"pretrain": 100, "sft": 50}, stream=out)
    progress.start(2, 9, STAGES[1], [])
    progress.line("step 5/20 | loss 5.1 | eta 1m30s")
    lines = out.getvalue().count("\n")
    for _ in range(3):
        clock[0] += runner.HEARTBEAT_S
        progress.tick(["sft"])
    printed = out.getvalue().splitlines()[lines:]
    # train.py's own eta, counted down since it was printed, and the 50 s stated for the sft stage
    assert [re.search(r"pipeline eta (\S+) \|", line).group(1) for line in printed] == ["1m50s", "1m20s", "50s"]


def test_the_gpu_size_trains_under_torchrun_on_max_iters():
    from gptkit.pipeline.sizes import SIZES
    from gptkit.pipeline.stages import Run, pretrain_commands, rl_commands

    run = Run(REPO / "run-gpu", SIZES["gpu"], nproc_per_node=8)
    for command in (pretrain_commands(run)[0], rl_commands(run)[0]):
        assert command.argv[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=8"]
        assert not any(a.startswith("--time_budget") for a in command.argv)  # one process's clock: refused there
    assert "--n_embd=768" in pretrain_commands(run)[0].argv


def test_each_corpus_becomes_our_bpe_trained_on_its_text(tmp_path, monkeypatch):
    """A web corpus is downloaded by prepare.py, then our BPE is trained on its Parquet files;
    Tiny Shakespeare comes from $TINYSHAKESPEARE, else prepare.py's download; a path is read."""
    from gptkit.pipeline.sizes import SIZES
    from gptkit.pipeline.stages import Run, corpus_commands

    def commands(corpus, **kw):
        return [c.argv[2:] for c in corpus_commands(Run(tmp_path, SIZES["laptop"], corpus=corpus, **kw))]

    bpe = ["--tokenizer=bpe", "--vocab_size=2048", "--name=corpus", f"--data_dir={tmp_path / 'data'}"]
    assert commands("fineweb_edu", shards=2) == [
        ["fineweb_edu", "--shards=2", f"--data_dir={tmp_path / 'data'}"],
        ["--input", str(tmp_path / "data" / "fineweb_edu" / "download"), *bpe]]
    monkeypatch.setenv("TINYSHAKESPEARE", str(tmp_path / "input.txt"))
    assert commands("shakespeare") == [["--input", str(tmp_path / "input.txt"), *bpe]]
    monkeypatch.delenv("TINYSHAKESPEARE")
    assert commands("shakespeare")[0] == ["shakespeare_char", f"--data_dir={tmp_path / 'data'}"]
    assert commands(str(tmp_path / "books")) == [["--input", str(tmp_path / "books"), *bpe]]


def test_sft_reads_the_arithmetic_conversations_and_online_no_robots_too(tmp_path):
    """Offline the chat data is the generated sums RL asks; with a web corpus (online) No
    Robots' conversations are downloaded by name and prepared with them, in the corpus's BPE."""
    from gptkit.pipeline.sizes import SIZES
    from gptkit.pipeline.stages import Run, chat_data_commands

    data = tmp_path / "data"

    def commands(corpus):
        return [c.argv[2:] for c in chat_data_commands(Run(tmp_path, SIZES["laptop"], corpus=corpus))]

    sums = str(data / "arithmetic_chat" / "conversations.jsonl")
    robots = str(data / "no_robots" / "conversations.jsonl")
    chat = ["--format=chat", "--tokenizer=bpe", f"--tokenizer_from={data / 'corpus'}", f"--data_dir={data}"]
    assert commands("shakespeare") == [["arithmetic_chat", f"--data_dir={data}"], ["chat", "--input", sums, *chat]]
    assert commands("fineweb_edu") == [["arithmetic_chat", f"--data_dir={data}"], ["no_robots", f"--data_dir={data}"],
                                       ["chat", "--input", sums, robots, *chat]]


def test_a_training_stage_resumed_after_its_last_step_keeps_the_figures_of_the_try_before():
    """Ctrl-C after train.py's last step: the next try resumes a finished run, which prints only
    its closing line; the eval line comes from the stage's log of the try before."""
    from gptkit.pipeline.stages import trained

    first = "eval 20 | train loss 1.5000 | val loss 1.6000 | val bpb 2.0000\nstopped by SIGINT at iteration 20\n"
    again = "resumed from run/pretrain/ckpt.pt at iteration 20\ndone: 20 iterations, best val loss 1.6000, ...\n"
    log = f"=== attempt 1\n{first}=== attempt 2\n{again}"
    assert trained(again, log) == {"iterations": 20, "train_loss": 1.5, "val_loss": 1.6, "best_val_loss": 1.6,
                                   "val_bpb": 2.0}
    with pytest.raises(UserError, match="closing 'done:' line"):
        trained(first, log)  # stopped: not finished


def test_a_ctrl_c_that_comes_while_a_command_starts_is_handed_to_it():
    """The signal lands after the last check and before the child is known: it still reaches
    the child (else a whole stage would run on after the Ctrl-C)."""
    signals = runner.Signals()
    signals.received = signal.SIGINT  # what the handler recorded, with no child to hand it to
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    signals.adopt(child)
    assert child.wait(timeout=30) != 0  # KeyboardInterrupt, not 60 s of sleep
