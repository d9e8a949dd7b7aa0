"""pipeline.py's stages, in order: each one our own commands, and the figures it reads
back from what they printed (or wrote as JSON), never computed a second time.

    corpus      prepare.py: the text, then our BPE sized to the model
    pretrain    train.py on it
    card        eval.py: val bits per byte and the report card (n/a, with why, offline)
    chat_data   prepare.py: arithmetic conversations in the corpus's BPE
    sft         train.py from the pretrained model on them
    rl          rl.py: GRPO on held-out-checkable sums; its pass@1 before and after
    card_after  eval.py again, on the final model
    export      convert.py --to hf and --to gguf
    report      eval.py plot, then report.md (gptkit/pipeline/report.py)

A stage that stopped half-way resumes with its command's own resume (train.py and
rl.py: --init_from=resume when ckpt.pt is there); an export already published
(convert.py writes under a temporary name) is not written again.
"""

import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from gptkit.ops.errors import UserError
from gptkit.pipeline.sizes import LLAMA

WEB_CORPORA = ("fineweb_edu", "openwebtext")  # prepare.py downloads these by name
CORPUS = "corpus"  # the dataset names under RUN/data
CHAT = "chat"


@dataclass
class Command:
    argv: list
    may_fail: bool = False  # exit 2 (a user's or a server's mistake, e.g. offline) is a figure: n/a, with why
    output: Path | None = None  # published atomically by the command: there already means done


@dataclass
class Stage:
    name: str
    title: str
    commands: object  # (Run) -> [Command]
    figures: object  # (Run, [text each command printed this time], the stage's whole log) -> dict
    resumes: str = ""  # how a stopped run of it goes on, for the report


@dataclass
class Run:
    """One pipeline run: its folder, its size's settings and the user's choices."""

    folder: Path
    size: dict
    corpus: str = "shakespeare"
    tasks: str = "core"
    task_files: list = field(default_factory=list)
    shards: int | None = None
    device: str = "auto"
    nproc_per_node: int = 1
    scripts: dict = field(default_factory=dict)  # name -> the path to run it by (pipeline.py's folder)
    python: str = sys.executable

    @property
    def data(self):
        return self.folder / "data"

    def out(self, stage):
        return self.folder / stage

    def script(self, name, distributed=False):
        path = str(self.scripts.get(name, name))
        if distributed and self.nproc_per_node > 1:
            return [self.python, "-m", "torch.distributed.run", "--standalone",
                    f"--nproc_per_node={self.nproc_per_node}", path]
        return [self.python, path]


def flags(settings):
    """{'max_iters': 20, 'bias': False} -> ['--max_iters=20', '--bias=false']"""
    return [f"--{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in settings.items()]


def resume_or_start(out_dir, start):
    """train.py's and rl.py's --init_from: resume a checkpoint this stage left, else start
    from `start` (over anything an attempt left before its first checkpoint)."""
    if (out_dir / "ckpt.pt").is_file():
        return ["--init_from=resume"]
    return [f"--init_from={start}", "--overwrite=true"]


def best_checkpoint(out_dir):
    """best.pt, else ckpt.pt: what eval.py, convert.py and serve.py read from a run folder."""
    best = out_dir / "best.pt"
    return best if best.is_file() else out_dir / "ckpt.pt"


# ---------------------------------------------------------------- corpus

def corpus_source(run):
    """The text our BPE is trained on and the model reads: (commands that fetch it, its path)."""
    if run.corpus in WEB_CORPORA:
        amount = [f"--shards={run.shards}"] if run.shards else []
        fetch = Command([*run.script("prepare.py"), run.corpus, *amount, f"--data_dir={run.data}"])
        return [fetch], run.data / run.corpus / "download"
    if run.corpus == "shakespeare":
        local = os.environ.get("TINYSHAKESPEARE")  # prepare.py's own variable for a local copy
        if local:
            return [], Path(local)
        fetch = Command([*run.script("prepare.py"), "shakespeare_char", f"--data_dir={run.data}"])
        return [fetch], run.data / "shakespeare_char" / "input.txt"
    return [], Path(run.corpus)


def corpus_commands(run):
    fetch, text = corpus_source(run)
    bpe = [*run.script("prepare.py"), "--input", str(text), "--tokenizer=bpe", f"--vocab_size={run.size['vocab_size']}",
           f"--name={CORPUS}", f"--data_dir={run.data}"]
    return [*fetch, Command(bpe)]


WROTE = re.compile(r"wrote \S+: train ([\d,]+) (?:tokens|conversations \(([\d,]+) tokens\)), "
                   r"val ([\d,]+)(?: tokens| \(([\d,]+) tokens\))")


def prepared(text):
    """prepare.py's closing line: {'train_tokens': ..., 'val_tokens': ...} (and conversations)."""
    found = WROTE.findall(text)
    if not found:
        raise UserError("prepare.py printed no 'wrote ...' line")
    train, train_tokens, val, val_tokens = found[-1]

    def number(s):
        return int(s.replace(",", ""))

    if train_tokens:  # a chat dataset counts conversations, then tokens
        return {"train_conversations": number(train), "train_tokens": number(train_tokens),
                "val_conversations": number(val), "val_tokens": number(val_tokens)}
    return {"train_tokens": number(train), "val_tokens": number(val)}


def corpus_figures(run, outputs, log):
    return {"vocab_size": run.size["vocab_size"], **prepared(outputs[-1])}


# ---------------------------------------------------------------- training

EVAL_LINE = re.compile(r"^eval (\d+) \| train loss ([\d.]+) \| val loss ([\d.]+)(?: \| val bpb ([\d.]+))?", re.M)
DONE_LINE = re.compile(r"^done: (\d+) iterations, best val loss ([\d.]+)", re.M)


def trained(text, log):
    """train.py's closing line (in `text`, this try's output) and its last eval line (in the
    stage's whole `log`: a try resumed after the last step evaluates nothing)."""
    done, evals = DONE_LINE.findall(text), EVAL_LINE.findall(log)
    if not done:
        raise UserError("train.py ended without its closing 'done:' line")
    if not evals:
        raise UserError("train.py printed no eval line")
    step, train_loss, val_loss, bpb = evals[-1]
    figures = {"iterations": int(done[-1][0]), "train_loss": float(train_loss), "val_loss": float(val_loss),
               "best_val_loss": float(done[-1][1])}
    if bpb:
        figures["val_bpb"] = float(bpb)
    return figures


def pretrain_commands(run):
    out = run.out("pretrain")
    settings = {**LLAMA, **run.size["model"], **run.size["pretrain"]}
    return [Command([*run.script("train.py", distributed=True), f"--dataset={CORPUS}", f"--data_dir={run.data}",
                     f"--out_dir={out}", f"--device={run.device}", *flags(settings),
                     *resume_or_start(out, "scratch")])]


def sft_commands(run):
    out = run.out("sft")
    start = best_checkpoint(run.out("pretrain"))
    return [Command([*run.script("train.py", distributed=True), f"--dataset={CHAT}", f"--data_dir={run.data}",
                     f"--out_dir={out}", f"--device={run.device}", *flags(run.size["sft"]),
                     *resume_or_start(out, start)])]


def training_figures(run, outputs, log):
    return trained(outputs[-1], log)


# ---------------------------------------------------------------- the report card

def card_commands(model_stage, card_name):
    def commands(run):
        model = str(run.out(model_stage))
        limit = [f"--max_tokens={run.size['card_tokens']}"] if run.size["card_tokens"] else []
        bpb = Command([*run.script("eval.py"), model, f"--dataset={CORPUS}", f"--data_dir={run.data}", *limit,
                       f"--device={run.device}", "--no_progress", f"--json={run.folder / f'{card_name}-bpb.json'}"])
        if run.tasks == "none":
            return [bpb]
        files = [f"--task_file={spec}" for spec in run.task_files]
        items = [f"--limit={run.size['card_limit']}"] if run.size.get("card_limit") else []
        tasks = Command([*run.script("eval.py"), model, f"--tasks={run.tasks}", *files, *items,
                         f"--device={run.device}", "--no_progress", f"--json={run.folder / f'{card_name}.json'}"],
                        may_fail=True)
        return [bpb, tasks]
    return commands


def card_figures(card_name):
    def figures(run, outputs, log):
        scored = json.loads((run.folder / f"{card_name}-bpb.json").read_text())["models"][0]
        result = {"val_loss": scored["loss"], "val_bpb": scored["bpb"], "scored_tokens": scored["tokens"]}
        if run.tasks == "none":
            result["card"] = {"n/a": "--tasks none"}
            return result
        path = run.folder / f"{card_name}.json"
        if path.is_file():
            result["card"] = json.loads(path.read_text())["models"][0]["tasks"]
        else:
            errors = [line for line in outputs[-1].splitlines() if line.startswith("error:")]
            result["card"] = {"n/a": errors[-1][len("error:"):].strip() if errors else "eval.py failed"}
        return result
    return figures


# ---------------------------------------------------------------- chat

def chat_data_commands(run):
    """The conversations SFT reads, in the corpus's BPE with the turn tokens after it
    (docs/chat.md): arithmetic_chat's (prepare.py makes them offline; RL's task asks the
    same sums) and, with a web corpus (online), No Robots' too, downloaded by name as the
    corpus was."""
    made = [run.data / "arithmetic_chat" / "conversations.jsonl"]
    commands = [Command([*run.script("prepare.py"), "arithmetic_chat", f"--data_dir={run.data}"])]
    if run.corpus in WEB_CORPORA:
        commands.append(Command([*run.script("prepare.py"), "no_robots", f"--data_dir={run.data}"]))
        made.append(run.data / "no_robots" / "conversations.jsonl")
    return [*commands, Command([*run.script("prepare.py"), CHAT, "--input", *map(str, made), "--format=chat",
                                "--tokenizer=bpe", f"--tokenizer_from={run.data / CORPUS}", f"--data_dir={run.data}"])]


def chat_data_figures(run, outputs, log):
    return prepared(outputs[-1])


RL_EVAL = re.compile(r"^eval (\d+) \| pass1 ([\d.]+) \| mean_reward ([\d.]+)", re.M)
RL_DONE = re.compile(r"^done: (\d+) steps", re.M)


def rl_commands(run):
    out = run.out("rl")
    return [Command([*run.script("rl.py", distributed=True), f"--out_dir={out}", f"--device={run.device}",
                     "--method=grpo", "--task=arithmetic", "--reward=exact", *flags(run.size["rl"]),
                     *resume_or_start(out, best_checkpoint(run.out("sft")))])]


def rl_figures(run, outputs, log):
    """pass@1 on held-out sums (greedy replies), before RL (rl.py's eval at step 0: the SFT
    model) and after; a resumed run's step-0 eval is in the stage's log from its first try."""
    evals, done = RL_EVAL.findall(log), RL_DONE.findall(outputs[-1])
    if not done or not evals:
        raise UserError("rl.py ended without its closing 'done:' line, or printed no eval line")
    before = [float(p) for step, p, _ in RL_EVAL.findall(log) if step == "0"]
    return {"steps": int(done[-1]), "exact_match_before": before[0] if before else None,
            "exact_match_after": float(evals[-1][1]), "mean_reward_after": float(evals[-1][2]),
            "eval_prompts": run.size["rl"]["eval_prompts"]}


# ---------------------------------------------------------------- exports and the report

def export_commands(run):
    model = str(run.out("rl"))
    return [Command([*run.script("convert.py"), model, str(run.folder / "hf"), "--to=hf"], output=run.folder / "hf"),
            Command([*run.script("convert.py"), model, str(run.folder / "model.gguf"), "--to=gguf"],
                    output=run.folder / "model.gguf")]


def export_figures(run, outputs, log):
    gguf = run.folder / "model.gguf"
    hf = sum(p.stat().st_size for p in (run.folder / "hf").iterdir())
    return {"hf": "hf", "hf_bytes": hf, "gguf": gguf.name, "gguf_bytes": gguf.stat().st_size}


def report_commands(run):
    return [Command([*run.script("eval.py"), "plot", str(run.out("pretrain")), str(run.out("sft")),
                     "--out", str(run.folder / "loss.png")], may_fail=True)]


def report_figures(run, outputs, log):
    return {"plot": "loss.png" if (run.folder / "loss.png").is_file() else None}


def serve_command(run):
    """The command that serves the chat model (the page at http://127.0.0.1:8000/)."""
    return f"python {run.scripts.get('serve.py', 'serve.py')} --out_dir {run.out('rl')}"


TRAIN_RESUME = "train.py --init_from=resume (ckpt.pt: saved at each eval and on Ctrl-C)"

STAGES = [
    Stage("corpus", "Corpus and tokenizer", corpus_commands, corpus_figures, resumes="prepared again (seconds)"),
    Stage("pretrain", "Pretraining", pretrain_commands, training_figures, resumes=TRAIN_RESUME),
    Stage("card", "Report card (pretrained)", card_commands("pretrain", "card-pretrain"),
          card_figures("card-pretrain"), resumes="scored again"),
    Stage("chat_data", "Chat data", chat_data_commands, chat_data_figures, resumes="prepared again"),
    Stage("sft", "Chat SFT", sft_commands, training_figures, resumes=TRAIN_RESUME),
    Stage("rl", "RL (GRPO)", rl_commands, rl_figures, resumes="rl.py --init_from=resume"),
    Stage("card_after", "Report card (chat, after RL)", card_commands("rl", "card-final"),
          card_figures("card-final"), resumes="scored again"),
    Stage("export", "Exports", export_commands, export_figures, resumes="an export already published is kept"),
    Stage("report", "Report", report_commands, report_figures, resumes="written again"),
]
