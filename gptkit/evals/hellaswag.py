"""HellaSwag, scored in its completion form as llm.c's dev/data/hellaswag.py scores it.

Each item is a context and four endings, one of them right. The model reads the
context followed by " " + ending and we take the losses of the ending's tokens:

    acc       the ending with the lowest SUM of its token losses
    acc_norm  the ending with the lowest MEAN of its token losses (the figure
              llm.c reports: GPT-2 124M scores 29.55% this way; chance is 25%)

FILE is HellaSwag's own `hellaswag_val.jsonl` (10,042 items), one JSON object a line
with "ctx", "endings" (four strings) and "label" (0-3):

    python eval.py out-shakespeare-char --hellaswag data/hellaswag_val.jsonl
    python eval.py --init_from gpt2 --hellaswag download   # fetched once into a cache folder

A context plus ending longer than the model's block is cut from the left (the
ending stays whole when it fits). Items that a character vocabulary cannot
encode are skipped and counted, never silently dropped.
"""

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from gptkit.ops.errors import UserError
from gptkit.ops.paths import cache_dir

URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
FILE_NAME = "hellaswag_val.jsonl"


def resolve_file(given):
    """The file to read: `given`, or for 'download' the cached copy (fetched when missing)."""
    if given != "download":
        path = Path(given)
        if not path.is_file():
            raise UserError(f"HellaSwag file {path} does not exist: pass the path of {FILE_NAME} (from {URL})")
        return path
    from gptkit.interop.hf_gpt2 import DownloadFailed, download_file

    path = cache_dir("hellaswag") / FILE_NAME  # where `--hellaswag download` keeps it
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        download_file(URL, path)
    except DownloadFailed as e:
        raise UserError(
            f"could not download HellaSwag from {URL} ({e.__cause__}). Offline? Fetch {FILE_NAME} elsewhere "
            f"and pass it: --hellaswag PATH/{FILE_NAME} (or copy it to {path})"
        )
    return path


def read_items(path):
    """[{'ctx', 'endings', 'label', 'line'}] from a HellaSwag .jsonl; a bad line is a
    UserError naming the file and the line."""
    items = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}, line {number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{where}: not valid JSON ({e.msg}, column {e.colno})")
            except (ValueError, RecursionError):  # a number of over 4,300 digits, nesting too deep
                raise UserError(f"{where}: not JSON this reader takes (nested too deeply, or a number of over 4,300 digits)") from None
            if not isinstance(row, dict):
                raise UserError(f"{where}: not a JSON object")
            ctx, endings, label = row.get("ctx"), row.get("endings"), row.get("label")
            if not (isinstance(ctx, str) and ctx):
                raise UserError(f'{where}: "ctx" must be a non-empty string')
            if not (isinstance(endings, list) and len(endings) == 4 and all(isinstance(e, str) and e for e in endings)):
                raise UserError(f'{where}: "endings" must be a list of 4 non-empty strings')
            if isinstance(label, str) and label.isdigit():
                label = int(label)
            if not isinstance(label, int) or isinstance(label, bool) or not 0 <= label < 4:
                raise UserError(f'{where}: "label" must be 0, 1, 2 or 3, not {label!r}')
            items.append({"ctx": ctx, "endings": endings, "label": label, "line": number})
    if not items:
        raise UserError(f"{path} holds no HellaSwag items")
    return items


def render(tokenizer, item, block_size):
    """Four (tokens, n_ending) pairs: context + " " + ending, cut from the left to at most
    block_size + 1 tokens (inputs are all but the last); n_ending is how many of the
    last tokens are the ending's. UserError when the tokenizer cannot encode the item."""
    ctx = tokenizer.encode(item["ctx"])
    rows = []
    for ending in item["endings"]:
        end = tokenizer.encode(" " + ending)
        tokens = (ctx + end)[-(block_size + 1) :]
        rows.append((tokens, min(len(end), len(tokens) - 1)))  # the first token is only context
    return rows


def ending_losses(model, rows, device, autocast):
    """(sum, mean) of each row's ending token losses: two float tensors (R,)."""
    width = max(len(tokens) for tokens, _ in rows) - 1
    x = torch.zeros(len(rows), width, dtype=torch.int64)
    y = torch.full((len(rows), width), -1, dtype=torch.int64)  # -1: not an ending token
    for r, (tokens, n_end) in enumerate(rows):
        t = torch.tensor(tokens, dtype=torch.int64)
        x[r, : len(t) - 1] = t[:-1]
        y[r, len(t) - 1 - n_end : len(t) - 1] = t[len(t) - n_end :]
    x, y = x.to(device), y.to(device)
    with autocast:
        logits, _ = model(x)  # (R, W, vocab)
    losses = F.cross_entropy(logits.float().transpose(1, 2), y, ignore_index=-1, reduction="none")  # (R, W)
    total = losses.sum(1)
    return total, total / (y >= 0).sum(1)


@torch.no_grad()
def evaluate(model, tokenizer, items, block_size, device, autocast, batch_size=8, bar=None):
    """{'acc', 'acc_norm', 'items', 'skipped', 'predictions'}: acc from the summed ending
    losses, acc_norm from their mean; predictions are (sum-based, mean-based) per item."""
    scored, predictions, skipped = [], [], 0
    per_pass = max(1, batch_size // 4)  # items per forward pass, 4 rows each
    pending = []

    def flush():
        rows = [row for _, item_rows in pending for row in item_rows]
        sums, means = ending_losses(model, rows, device, autocast)
        for i, (item, _) in enumerate(pending):
            predictions.append((int(sums[4 * i : 4 * i + 4].argmin()), int(means[4 * i : 4 * i + 4].argmin())))
            scored.append(item)
        if bar is not None:
            bar.update(len(pending))
        pending.clear()

    for item in items:
        try:
            rows = render(tokenizer, item, block_size)
        except UserError:  # characters outside a character vocabulary
            skipped += 1
            if bar is not None:
                bar.update(1)
            continue
        pending.append((item, rows))
        if len(pending) == per_pass:
            flush()
    if pending:
        flush()
    n = len(scored)  # 0 when a character vocabulary can encode no item: accuracies are NaN
    return {
        "acc": sum(p[0] == item["label"] for p, item in zip(predictions, scored)) / n if n else math.nan,
        "acc_norm": sum(p[1] == item["label"] for p, item in zip(predictions, scored)) / n if n else math.nan,
        "items": n,
        "skipped": skipped,
        "predictions": predictions,
    }
