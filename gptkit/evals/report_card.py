"""eval.py --tasks: score each model on the named tasks and print one report card.

Per task: the items scored (and skipped: a character vocabulary that cannot encode
them), the accuracy the task is known by (acc or acc_norm, as lm-evaluation-harness
reports it; a chat model's letter answers: acc), the random baseline, and the
centered accuracy (acc - random) / (1 - random): 0 is guessing, 1 is every item right.
The summary is the mean centered accuracy over the tasks scored, the way DCLM's CORE
score is built (Li et al. 2024, "DataComp-LM", arXiv:2406.11794; nanochat prints it
as CORE for base models and ChatCORE for chat models). See docs/evaluation.md.

Each figure carries its standard error, as lm-evaluation-harness reports acc_stderr:
the sample standard deviation of the items' 0/1 outcomes over sqrt(n), which for an
accuracy p is sqrt(p(1 - p) / (n - 1)) (lm_eval.api.metrics.mean_stderr). The centered
accuracy divides it by (1 - random); the summary, a mean of K independent tasks, has
sqrt(sum of the squared centered errors) / K.
"""

import math
from collections import Counter

import torch

from gptkit.evals import task_scoring as ts
from gptkit.ops.errors import UserError
from gptkit.evals.tasks import normal_number, number_is_right, random_baseline


def first_best(values):
    """The index of the largest value, the first one on a tie (as numpy's argmax)."""
    return max(range(len(values)), key=lambda i: (values[i], -i))


class Skips:
    """The items a model cannot be asked: how many, the characters its vocabulary lacks
    (a character tokenizer's), and any other reason, for one line of the notes."""

    def __init__(self, tokenizer):
        self.tokenizer, self.count, self.lacking, self.reasons = tokenizer, 0, set(), Counter()

    def add(self, text, error):
        """Count an item whose `text` raised `error` (a UserError) when it was encoded."""
        self.count += 1
        lacking = self.tokenizer.unknown(text) if hasattr(self.tokenizer, "unknown") else []
        if lacking:
            self.lacking.update(lacking)
        else:
            self.reasons[str(error)] += 1

    def why(self):
        """"the vocabulary lacks 'é', '—'; 2 items: REASON": what the skipped items lacked."""
        parts = []
        if self.lacking:
            shown = sorted(self.lacking)
            more = f" and {len(shown) - 20} more" if len(shown) > 20 else ""
            parts.append("the vocabulary lacks " + ", ".join(repr(ch) for ch in shown[:20]) + more)
        parts += [f"{n:,} item{'s' if n > 1 else ''}: {reason}" for reason, n in self.reasons.items()]
        return "; ".join(parts)


def item_text(item):
    """Everything of an item a base model reads: its contexts and continuations."""
    return "".join(context + continuation for context, continuation in item.pairs)


def rows_by_item(tokenizer, items, block_size):
    """(items that encode, their rows, one list per item, and the Skips of the others)."""
    scored, rows, skips = [], [], Skips(tokenizer)
    for item in items:
        try:
            rows.append(ts.rows_of(tokenizer.encode, item.pairs, block_size, tokenizer.eot_id))
        except UserError as e:  # characters outside a character vocabulary
            skips.add(item_text(item), e)
            continue
        scored.append(item)
    return scored, rows, skips


def base_choices(candidate, items, settings, batch_rows, bar):
    """(scored items, [(acc pick, acc_norm pick, acc_norm_tokens pick)], Skips) for a base model.

    acc: the answer with the largest summed log probability. acc_norm: the largest per
    character of the answer, lm-evaluation-harness's acc_norm, the headline (a figure
    that does not depend on the tokenizer). acc_norm_tokens: the largest per token of
    the answer, the mean that llm.c's HellaSwag reports (GPT-2 124M: 29.55%), kept
    under its own name for comparison with it."""
    scored, rows, skips = rows_by_item(candidate.tokenizer, items, candidate.block_size)
    flat = [r for item_rows in rows for r in item_rows]
    results = ts.score_rows(candidate.model, flat, settings.device, settings.autocast, batch_rows,
                            on_batch=bar.update if bar is not None else None)
    picks, at = [], 0
    for item in scored:
        lls = [ll for ll, _ in results[at : at + len(item.pairs)]]
        n_tokens = [n for _, n in flat[at : at + len(item.pairs)]]
        at += len(item.pairs)
        per_char = [ll / max(1, len(text)) for ll, text in zip(lls, item.choice_texts)]
        per_token = [ll / n for ll, n in zip(lls, n_tokens)]
        picks.append((first_best(lls), first_best(per_char), first_best(per_token)))
    return scored, picks, skips


def encodable(tokenizer, items, text_of, check):
    """(the items `check` accepts, the Skips of the others); text_of(item) is what check encodes."""
    scored, skips = [], Skips(tokenizer)
    for item in items:
        try:
            check(item)
        except UserError as e:
            skips.add(text_of(item), e)
            continue
        scored.append(item)
    return scored, skips


def score_task(candidate, task, items, settings, batch_rows=32, bar=None):
    """One task's line of the report card, a dict (its "predictions" are for tests)."""
    model, tok, T = candidate.model, candidate.tokenizer, candidate.block_size
    chat = ts.is_chat_model(model, tok)
    line = {"task": task.name, "title": task.title, "form": "chat" if chat and task.kind != "word" else "text"}
    if task.kind == "choice" and not chat:
        scored, picks, skips = base_choices(candidate, items, settings, batch_rows, bar)
        line["acc"] = _mean(p[0] == it.gold for p, it in zip(picks, scored))
        line["acc_norm"] = _mean(p[1] == it.gold for p, it in zip(picks, scored))
        line["acc_norm_tokens"] = _mean(p[2] == it.gold for p, it in zip(picks, scored))
        line["metric"] = task.headline
    elif task.kind == "choice":
        scored, skips = encodable(tok, items, ts.chat_question, lambda it: ts.choice_prompt(tok, it, T))
        picks = ts.chat_choices(model, tok, scored, T, settings.device, settings.autocast, batch_rows,
                                bar.update if bar is not None else None)
        line["acc"] = _mean(p == it.gold for p, it in zip(picks, scored))
        line["metric"] = "acc"
    elif task.kind == "word":
        scored, item_rows, skips = rows_by_item(tok, items, T)
        rows = [r[0] for r in item_rows]  # one continuation: the last word
        results = ts.score_rows(model, rows, settings.device, settings.autocast, batch_rows,
                                on_batch=bar.update if bar is not None else None)
        picks = [greedy for _, greedy in results]
        line["acc"] = _mean(picks)
        tokens = sum(n for _, n in rows)
        line["ppl"] = math.exp(-sum(ll for ll, _ in results) / tokens) if tokens else math.nan
        line["metric"] = "acc"
    else:
        if chat:
            scored, skips = encodable(tok, items, lambda it: it.question,
                                      lambda it: ts.chat_prompt(tok, it.question, T))
            answer = ts.chat_number_answers
        else:
            scored, skips = encodable(tok, items, lambda it: it.pairs[0][0], lambda it: tok.encode(it.pairs[0][0]))
            answer = ts.base_number_answers
        texts = answer(model, tok, scored, T, settings.device, settings.autocast,
                       on_item=bar.update if bar is not None else None)
        picks = [normal_number(text) for text in texts]
        line["acc"] = _mean(number_is_right(text, it.gold) for text, it in zip(texts, scored))
        line["metric"] = "acc"
    line["items"], line["skipped"], line["skipped_why"] = len(scored), skips.count, skips.why()
    line["random"] = random_baseline(task, scored if scored else items)
    value = line[line["metric"]]
    line["centered"] = (value - line["random"]) / (1 - line["random"]) if not math.isnan(value) else math.nan
    line["stderr"] = binomial_stderr(value, line["items"])  # of the metric shown
    line["centered_stderr"] = line["stderr"] / (1 - line["random"])
    line["predictions"] = picks
    return line


def _mean(flags):
    flags = list(flags)
    return sum(bool(f) for f in flags) / len(flags) if flags else math.nan


def work_units(candidate, task, items):
    """What the progress bar counts for a task: sequences for base choices, items otherwise."""
    chat = ts.is_chat_model(candidate.model, candidate.tokenizer)
    if task.kind == "choice" and not chat:
        return sum(len(it.pairs) for it in items)
    return len(items)


@torch.no_grad()
def score_tasks(candidate, tasks, settings, batch_rows, progress_bar):
    """{"tasks": [line, ...], "summary": mean centered accuracy}: the card of one model."""
    total = sum(work_units(candidate, task, items) for task, items in tasks)
    bar = progress_bar(total, settings, f"{candidate.name} tasks", "seq")
    lines = []
    try:
        for task, items in tasks:
            if bar is not None:
                bar.set_description(f"{candidate.name} {task.name}")
            before = bar.n if bar is not None else 0
            lines.append(score_task(candidate, task, items, settings, batch_rows, bar))
            if bar is not None:  # skipped items were never counted: catch up to the task's end
                bar.update(before + work_units(candidate, task, items) - bar.n)
    finally:
        if bar is not None:
            bar.close()
    return {"tasks": lines, "summary": summary(lines), "summary_stderr": summary_stderr(lines)}


def binomial_stderr(p, n):
    """The standard error of an accuracy p over n items, as lm-evaluation-harness's
    mean_stderr computes it from the 0/1 outcomes: sqrt(p(1 - p) / (n - 1)); NaN under 2 items."""
    return math.sqrt(p * (1 - p) / (n - 1)) if n > 1 and not math.isnan(p) else math.nan


def summary(lines):
    """The mean centered accuracy over the tasks with items scored (NaN when none)."""
    values = [line["centered"] for line in lines if line["items"]]
    return sum(values) / len(values) if values else math.nan


def summary_stderr(lines):
    """The standard error of summary(lines): the tasks are independent samples, so the
    variance of their mean is the sum of their variances over K squared."""
    errors = [line["centered_stderr"] for line in lines if line["items"]]
    return math.sqrt(sum(e * e for e in errors)) / len(errors) if errors else math.nan


def _pct(x, stderr=None):
    """"41.20%", and with a standard error "41.20% ± 3.10" (in percentage points)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if stderr is None or math.isnan(stderr):
        return f"{100 * x:.2f}%"
    return f"{100 * x:.2f}% ± {100 * stderr:.2f}"


def card_table(results):
    """Rows: tasks, then the summary; columns: the task, its metric and random baseline,
    then for each model the items scored, the accuracy and the centered accuracy."""
    cards = [(r.name, r.tasks) for r in results if r.tasks is not None]
    head = ["task", "metric", "random"]
    for name, _ in cards:
        head += [f"{name} items", f"{name} acc", f"{name} centered"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for i, first in enumerate(cards[0][1]["tasks"]):
        cells = [first["title"] + (" (chat)" if first["form"] == "chat" else ""), first["metric"],
                 _pct(first["random"])]
        for _, card in cards:
            line = card["tasks"][i]
            items = f"{line['items']:,}" + (f" ({line['skipped']:,} skipped)" if line["skipped"] else "")
            value = _pct(line[line["metric"]], line["stderr"])
            if line["metric"] != first["metric"] or line["form"] != first["form"]:  # a chat model beside a base one
                value += f" ({line['metric']}{', chat' if line['form'] == 'chat' else ''})"
            cells += [items, value, _pct(line["centered"], line["centered_stderr"])]
        lines.append("| " + " | ".join(cells) + " |")
    cells = ["**summary**", "mean centered", ""]
    for _, card in cards:
        cells += ["", "", f"**{_pct(card['summary'], card['summary_stderr'])}**"]
    lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def card_json(card):
    return {"summary": card["summary"], "summary_stderr": card["summary_stderr"],
            "tasks": [{k: v for k, v in line.items() if k != "predictions"} for line in card["tasks"]]}
