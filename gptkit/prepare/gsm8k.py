"""GSM8K as chat conversations whose worked answers call the calculator (nanochat's way).

    python prepare.py gsm8k_chat                          # GSM8K's train split, downloaded once
    python prepare.py gsm8k_chat --input train.jsonl      # a local copy (.jsonl or .parquet rows)

GSM8K's answers carry calculator annotations: "Natalia sold 48/2 = <<48/2=24>>24 clips
in May.\\n... #### 72". Each <<expression=result>> becomes a tool call in the assistant's
reply (docs/chat.md's layout): the text before it, a calculator call of the expression,
the calculator's own output (what generation will force in, e.g. "24" for 48/2), then the
reply going on with the text after it. An annotation the calculator cannot evaluate
stays as its result in the text. The conversations are prepared as any chat input (GPT-2
BPE); `eval.py --tasks gsm8k` asks a chat model with the tool tokens through the same
calculator.
"""

import json
import re
from pathlib import Path

from gptkit.data.chat import calculator_call
from gptkit.generation.tools import calculate
from gptkit.ops.errors import UserError
from gptkit.ops.paths import claim_output

ANNOTATION = re.compile(r"<<([^<>=]*)=([^<>]*)>>")  # <<48/2=24>>: the expression, its result


def gsm8k_messages(question, answer):
    """The messages of one GSM8K item: the question, then the worked answer with its
    annotations as calculator calls (their outputs the calculator's)."""
    messages, text, end = [{"role": "user", "content": question}], "", 0
    for match in ANNOTATION.finditer(answer):
        text += answer[end : match.start()]
        end = match.end()
        expression = match.group(1).strip()
        output = calculate(expression)
        if output.startswith("error: "):  # not arithmetic the calculator takes: the result stays text
            text += match.group(2)
            continue
        messages += [{"role": "assistant", "content": text, "tool_calls": [calculator_call(expression)]},
                     {"role": "tool", "content": output}]
        text = ""
    return messages + [{"role": "assistant", "content": text + answer[end:]}]


def gsm8k_conversations(path):
    """The conversations of a GSM8K file ({"question", "answer"} rows, .jsonl or .parquet, read
    as eval.py reads its tasks' files)."""
    from gptkit.evals.tasks import read_rows

    path = Path(path)
    if not path.is_file():
        raise UserError(f"GSM8K file {path} does not exist")
    out = []
    for n, row in read_rows(path):
        if not isinstance(row, dict) or not all(isinstance(row.get(k), str) for k in ("question", "answer")):
            raise UserError(f'{path}:{n}: not a GSM8K row {{"question": "...", "answer": "... #### N"}}')
        out.append({"messages": gsm8k_messages(row["question"], row["answer"])})
    return out


def prepare_gsm8k_chat(out_dir="data", input_path=None, progress=True):
    """data/gsm8k_chat: GSM8K's train split (downloaded once into eval.py's cache, where rl.py's
    GSM8K comes from too, or `input_path`) as conversations with calculator calls, written to
    conversations.jsonl there, then prepared with GPT-2 BPE."""
    from gptkit.evals.tasks import gsm8k_split, resolve_file
    from gptkit.prepare.chat import prepare_chat

    instead = "pass a .jsonl or .parquet of its rows as --input"
    source = Path(input_path) if input_path is not None else resolve_file(gsm8k_split("train"), instead=instead)
    conversations = gsm8k_conversations(source)  # a bad line fails before the folder is claimed
    folder = claim_output(Path(out_dir) / "gsm8k_chat", "folder", overwrite=True,
                          what="the dataset folder (--data_dir)")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "conversations.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for conversation in conversations:
            f.write(json.dumps(conversation) + "\n")
    return prepare_chat([path], "gpt2", "gsm8k_chat", out_dir, progress=progress)
