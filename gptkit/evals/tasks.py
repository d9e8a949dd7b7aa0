"""The standard evaluation tasks, read from their publishers' files: what eval.py --tasks scores.

    python eval.py out-gpt2-run --tasks core                 # fetched by name once, then cached
    python eval.py out-chat --tasks chat --json card.json
    python eval.py out-a out-b --tasks arc_easy,piqa --task_file arc_easy=ARC-Easy-test.parquet

Each task is one file of its publisher on the Hugging Face Hub (the copy
lm-evaluation-harness reads), read with the field names it has there, and each item becomes:

    pairs     for a base model: one (context, continuation) per answer, as
              lm-evaluation-harness writes the task (its task yaml's doc_to_text,
              doc_to_choice and target_delimiter " "); the answer whose continuation
              is likeliest is the model's choice (gptkit/evals/task_scoring.py)
    question, options
              for a chat model: the question and its answers, asked in the chat
              template with the answers as letters A, B, C, ...
    gold      the right answer's index; LAMBADA's last word; GSM8K's final number

The gold answer lives in the item for the accuracy only: scoring sees pairs,
questions and options, never gold (a test permutes it).

A file fetched by name is kept in $GPTKIT_CACHE_DIR/tasks/NAME/ (default
~/.cache/gptkit); --hub_url (or HF_ENDPOINT) points the Hub's files at a mirror.
"""

import json
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from gptkit.ops.errors import UserError
from gptkit.ops.paths import cache_dir
from gptkit.prepare.download import fetch_whole

HUB_URL = "https://huggingface.co"
TASK_FILE_BYTES = 100 << 20  # the most a task file's download may bring (several times the largest)
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"  # a chat model answers a multiple-choice item by letter


@dataclass
class Item:
    where: str  # "FILE, item N": where an error or a skipped item points
    pairs: list  # [(context, continuation)]: one per answer (LAMBADA: one), the base form
    gold: object  # the right answer's index (int), LAMBADA's word, GSM8K's number (str)
    question: str = ""  # the chat form: the question, then `options` as letters
    options: list = field(default_factory=list)
    choice_texts: list = field(default_factory=list)  # lm-eval's acc_norm divides by these lengths


@dataclass(frozen=True)
class Task:
    name: str
    title: str
    kind: str  # "choice" (multiple choice), "word" (LAMBADA's last word), "number" (GSM8K)
    repo: str  # the Hub dataset
    file: str  # the file in that repository
    headline: str  # the metric the report card shows: "acc" or "acc_norm" (as lm-eval reports it)

    def url(self, hub_url=None):
        base = (hub_url or os.environ.get("HF_ENDPOINT") or HUB_URL).rstrip("/")
        return f"{base}/datasets/{self.repo}/resolve/main/{self.file}"


TASKS = {t.name: t for t in (
    Task("arc_easy", "ARC-Easy", "choice", "allenai/ai2_arc", "ARC-Easy/test-00000-of-00001.parquet", "acc_norm"),
    Task("arc_challenge", "ARC-Challenge", "choice", "allenai/ai2_arc", "ARC-Challenge/test-00000-of-00001.parquet",
         "acc_norm"),
    Task("piqa", "PIQA", "choice", "baber/piqa", "piqa_validation.parquet", "acc_norm"),  # lm-eval's copy
    Task("winogrande", "Winogrande", "choice", "allenai/winogrande", "winogrande_xl/validation-00000-of-00001.parquet",
         "acc"),
    Task("hellaswag", "HellaSwag", "choice", "Rowan/hellaswag", "data/validation-00000-of-00001.parquet", "acc_norm"),
    Task("mmlu", "MMLU", "choice", "cais/mmlu", "all/test-00000-of-00001.parquet", "acc"),
    Task("lambada", "LAMBADA", "word", "EleutherAI/lambada_openai", "data/lambada_test_en.jsonl", "acc"),
    Task("gsm8k", "GSM8K", "number", "openai/gsm8k", "main/test-00000-of-00001.parquet", "acc"),
)}

# Named sets: `core` for base models (nanochat's CORE idea: centered accuracy on
# completion-scored tasks), `chat` for chat models (nanochat's ChatCORE tasks we have).
SETS = {
    "core": ("arc_easy", "arc_challenge", "piqa", "winogrande", "hellaswag", "lambada"),
    "chat": ("arc_easy", "arc_challenge", "mmlu", "gsm8k"),
    "all": tuple(TASKS),
}


def gsm8k_split(split):
    """GSM8K's `split` ("train" or "test") as a task: the same dataset, file layout and
    cache folder as eval.py's (its test split), so that rl.py's prompts and eval.py's
    items come from one download."""
    task = TASKS["gsm8k"]
    return replace(task, file=task.file.replace("test-", f"{split}-"))


def parse_names(text):
    """The task names of --tasks: names and set names, comma-separated, in order, once each."""
    names = []
    for part in (p.strip() for p in text.split(",")):
        if part in SETS:
            names += SETS[part]
        elif part in TASKS:
            names.append(part)
        else:
            raise UserError(f"--tasks: unknown task {part!r}: choose from {', '.join(TASKS)} or a set "
                            f"({', '.join(SETS)})")
    return list(dict.fromkeys(names))


def parse_files(pairs):
    """--task_file NAME=PATH ...: {name: Path}."""
    files = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or not path:
            raise UserError(f"--task_file {pair!r}: write NAME=PATH, e.g. arc_easy=test-00000-of-00001.parquet")
        if name not in TASKS:
            raise UserError(f"--task_file {pair!r}: unknown task {name!r}: choose from {', '.join(TASKS)}")
        files[name] = Path(path)
    return files


def resolve_file(task, given=None, hub_url=None, instead=None):
    """The file to read for `task`: `given`, or the cached copy, fetched when missing.
    `instead` says what to pass when the download fails (eval.py's --task_file)."""
    if given is not None:
        if not given.exists():
            raise UserError(f"{task.title} file {given} does not exist: pass {task.file.rsplit('/', 1)[-1]} "
                            f"(from {task.url(hub_url)})")
        if not given.is_file():
            raise UserError(f"{task.title} file {given} is not a file: pass {task.file.rsplit('/', 1)[-1]}")
        return given
    path = cache_dir("tasks") / task.name / task.file.rsplit("/", 1)[-1]
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    instead = instead or f"pass it: --task_file {task.name}=PATH"
    fetch_whole(task.url(hub_url), path, TASK_FILE_BYTES, task.title, hint=(
        f". Offline? Fetch the file elsewhere and {instead} (or copy it to {path})"))
    return path


def read_rows(path):
    """The records of a .parquet or .jsonl file, as dicts, with their numbers (from 1)."""
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise UserError(f"reading {path} (a parquet file) needs pyarrow: pip install pyarrow") from None
        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as e:  # pyarrow's own error types for a damaged or foreign file
            raise UserError(f"{path} is not a readable parquet file: {str(e).splitlines()[0]}") from None
        return list(enumerate(rows, 1))
    rows = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append((number, json.loads(line)))
            except (ValueError, RecursionError):
                raise UserError(f"{path}, line {number}: not valid JSON") from None
    return rows


def _text(row, key, where):
    value = row.get(key) if isinstance(row, dict) else None
    if not isinstance(value, str) or not value.strip():
        raise UserError(f'{where}: "{key}" must be a non-empty string')
    return value


def _texts(value, key, where, least=2):
    if not (isinstance(value, list) and len(value) >= least and all(isinstance(v, str) and v for v in value)):
        raise UserError(f'{where}: "{key}" must be a list of at least {least} non-empty strings')
    return value


def _choice_item(where, context, options, gold, question, delimiter=" "):
    return Item(where, [(context, delimiter + o) for o in options], gold, question, list(options), list(options))


def arc(row, where):
    """The Hub's rows, or AI2's own .jsonl (ARC-V1-Feb2018), whose "question" holds a
    "stem" and "choices" as [{"text", "label"}]."""
    if isinstance(row.get("question"), dict):
        asked = row["question"]
        listed = asked.get("choices")
        if not (isinstance(listed, list) and all(isinstance(c, dict) for c in listed)):
            raise UserError(f'{where}: "question.choices" must be a list of {{"text", "label"}} objects')
        row = {"question": asked.get("stem"), "answerKey": row.get("answerKey"),
               "choices": {"text": [c.get("text") for c in listed], "label": [c.get("label") for c in listed]}}
    question = _text(row, "question", where)
    choices = row.get("choices")
    if not isinstance(choices, dict):
        raise UserError(f'{where}: "choices" must be an object with "text" and "label" lists')
    texts = _texts(choices.get("text"), "choices.text", where)
    labels = _texts(choices.get("label"), "choices.label", where)
    if len(labels) != len(texts):
        raise UserError(f'{where}: "choices" has {len(texts)} texts but {len(labels)} labels')
    key = row.get("answerKey")
    if key not in labels:
        raise UserError(f'{where}: "answerKey" {key!r} is not one of the labels {labels}')
    return _choice_item(where, f"Question: {question}\nAnswer:", texts, labels.index(key), question)


def piqa(row, where):
    goal, sol1, sol2 = (_text(row, k, where) for k in ("goal", "sol1", "sol2"))
    label = row.get("label")
    if label not in (0, 1) or isinstance(label, bool):
        raise UserError(f'{where}: "label" must be 0 or 1, not {label!r}')
    return _choice_item(where, f"Question: {goal}\nAnswer:", [sol1, sol2], label, goal)


def winogrande(row, where):
    """Partial scoring (Trinh and Le 2018), as lm-eval: the sentence up to the blank with
    each option is the context, the rest of the sentence the one continuation."""
    sentence = _text(row, "sentence", where)
    options = [_text(row, k, where) for k in ("option1", "option2")]
    answer = row.get("answer")
    if answer not in ("1", "2"):
        raise UserError(f'{where}: "answer" must be "1" or "2", not {answer!r}')
    if "_" not in sentence:
        raise UserError(f'{where}: "sentence" has no blank "_"')
    blank = sentence.index("_")
    rest = sentence[blank + 1 :].strip()
    return Item(where, [(sentence[:blank] + o, " " + rest) for o in options], int(answer) - 1,
                f"{sentence}\nWhich option fills the blank _?", options, [rest, rest])


def mmlu(row, where):
    question = _text(row, "question", where)
    choices = row.get("choices")
    if not (isinstance(choices, list) and len(choices) == 4 and all(isinstance(c, str) for c in choices)):
        raise UserError(f'{where}: "choices" must be a list of 4 strings')
    answer = row.get("answer")
    if not isinstance(answer, int) or isinstance(answer, bool) or not 0 <= answer < 4:
        raise UserError(f'{where}: "answer" must be 0, 1, 2 or 3, not {answer!r}')
    subject = row.get("subject")
    head = f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n" \
        if isinstance(subject, str) and subject else ""
    context = head + question.strip() + "".join(f"\n{L}. {c}" for L, c in zip(LETTERS, choices)) + "\nAnswer:"
    item = _choice_item(where, context, list("ABCD"), answer, question.strip())
    item.options = choices
    return item


def hellaswag(row, where):
    """The Hub's rows (lm-eval's copy) or the authors' hellaswag_val.jsonl: the context,
    then " " + each of the four endings, as llm.c and lm-eval's completion form score it."""
    ctx = _text(row, "ctx", where)
    endings = row.get("endings")
    if not (isinstance(endings, list) and len(endings) == 4 and all(isinstance(e, str) and e for e in endings)):
        raise UserError(f'{where}: "endings" must be a list of 4 non-empty strings')
    label = row.get("label")
    if isinstance(label, str) and label.isdigit():  # the Hub's copy writes it as a string
        label = int(label)
    if not isinstance(label, int) or isinstance(label, bool) or not 0 <= label < 4:
        raise UserError(f'{where}: "label" must be 0, 1, 2 or 3, not {label!r}')
    return _choice_item(where, ctx, endings, label, ctx)


def lambada(row, where):
    text = _text(row, "text", where)
    context, _, word = text.rpartition(" ")
    if not context:
        raise UserError(f'{where}: "text" needs at least two words')
    return Item(where, [(context, " " + word)], word)


ANSWER_MARK = "####"  # GSM8K's worked answers end with "#### 72"


def gsm8k(row, where):
    question = _text(row, "question", where)
    try:
        gold = gsm8k_gold(_text(row, "answer", where))
    except UserError as e:
        raise UserError(f"{where}: {e}") from None
    return Item(where, [(f"Question: {question}\nAnswer:", "")], gold, question)


def gsm8k_gold(answer):
    """The gold number of a GSM8K answer: what follows its "####" mark, normalised as a
    reply's number is (normal_number). An answer without the mark, or with nothing but
    words after it, is refused: it would reward every reply that writes no number."""
    if ANSWER_MARK not in answer:
        raise UserError(f'"answer" has no "{ANSWER_MARK} NUMBER" at its end')
    tail = answer.rsplit(ANSWER_MARK, 1)[1]
    gold = normal_number(tail)
    if gold is None:
        raise UserError(f'"answer" ends in {tail.strip()!r} after "{ANSWER_MARK}", not a number')
    return gold


NUMBER = re.compile(r"-?[0-9][0-9,]*(?:\.[0-9]+)?")


def normal_number(text):
    """GSM8K's answer rule: the last number in text (after its last "####" where it writes
    one, GSM8K's own way), dollar signs and commas gone, a decimal's trailing zeros dropped
    ("$1,205.00." -> "1205"); None when there is none. eval.py --tasks gsm8k and rl.py's
    final_number reward both score with it (number_is_right)."""
    if ANSWER_MARK in text:
        text = text.rsplit(ANSWER_MARK, 1)[1]
    found = NUMBER.findall(text.replace("$", ""))
    if not found:
        return None
    number = found[-1].replace(",", "")
    if "." in number:
        number = number.rstrip("0").rstrip(".")
    return number


def number_is_right(reply, gold):
    """Whether a reply to a GSM8K question is right: its number (normal_number) is the
    gold one's. The one scorer of GSM8K (as nanochat's tasks/gsm8k.py, whose reward
    re-uses its evaluation): eval.py's accuracy and rl.py's reward."""
    want = normal_number(gold)
    return want is not None and normal_number(reply) == want


READERS = {"arc_easy": arc, "arc_challenge": arc, "piqa": piqa, "winogrande": winogrande, "hellaswag": hellaswag,
           "mmlu": mmlu, "lambada": lambada, "gsm8k": gsm8k}


def read_task(task, path, limit=None):
    """The items of `task` from its publisher's file at `path` (the first `limit`)."""
    reader, items = READERS[task.name], []
    for number, row in read_rows(path):
        kind = "line" if path.suffix != ".parquet" else "row"
        where = f"{path}, {kind} {number}"
        if not isinstance(row, dict):
            raise UserError(f"{where}: not a JSON object")
        items.append(reader(row, where))
        if limit is not None and len(items) >= limit:
            break
    if not items:
        raise UserError(f"{path} holds no {task.title} items")
    return items


def random_baseline(task, items):
    """The accuracy of guessing: the mean of 1/answers over the items (0 for word and number tasks)."""
    if task.kind != "choice" or not items:
        return 0.0
    return sum(1 / len(it.pairs) for it in items) / len(items)
