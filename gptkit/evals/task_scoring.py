"""Scoring the tasks of gptkit/evals/tasks.py: many answers per forward pass.

A base model (its own vocabulary, no turn tokens):

    choice   each answer's continuation is scored by the sum of its tokens' log
             probabilities given the context; acc takes the likeliest answer,
             acc_norm the likeliest per character (lm-evaluation-harness's two)
    word     LAMBADA: right when greedy decoding writes the last word, every token
    number   GSM8K: the prompt, then greedy decoding until a blank line or the next
             "Question:"; right when the last number written is the answer's

A chat model (its vocabulary plus the turn tokens, gptkit/data/chat.py) is asked in its
template: a multiple-choice question with its answers lettered A, B, ... is answered by
the letter its first reply token likes best; GSM8K's question is a user turn and the
reply is read to its <|end|>. LAMBADA stays plain text.

Context and continuation are encoded as lm-evaluation-harness encodes them (spaces at
the context's end move to the continuation; the continuation is what encoding both
adds to encoding the context) and cut from the left to the model's block, so that the
two agree item by item (tests/test_tasks_lm_eval.py). Rows are sorted by length and
packed into forward passes of `rows` sequences; the output layer runs only where a
continuation token is predicted. Nothing here reads an item's gold answer.
"""

import torch
import torch.nn.functional as F

from gptkit.data.chat import chat_vocabulary, prompt_ids, turn_ids
from gptkit.ops.errors import UserError
from gptkit.evals.tasks import LETTERS


def encode_pair(encode, context, continuation, eot_id=None):
    """(context ids, continuation ids), as lm-evaluation-harness's causal models encode them."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    if not context:  # lm-eval reads an empty context as the end-of-text token
        if eot_id is None:
            raise UserError("an empty context and no end-of-text token to stand for it")
        return [eot_id], encode(continuation)
    whole, ctx = encode(context + continuation), encode(context)
    cont = whole[len(ctx) :]
    if not cont:
        raise UserError("the continuation encodes to no tokens")
    return ctx, cont


def rows_of(encode, pairs, block_size, eot_id=None):
    """Each pair as (tokens, n): context + continuation cut from the left to block_size + 1
    tokens (the inputs are all but the last), n the continuation's last tokens scored."""
    rows = []
    for context, continuation in pairs:
        ctx, cont = encode_pair(encode, context, continuation, eot_id)
        tokens = (ctx + cont)[-(block_size + 1) :]
        rows.append((tokens, min(len(cont), len(tokens) - 1)))
    return rows


def vocabulary_log_probs(logits):
    """log p(token | context) over the whole vocabulary, in float32: every score is one of these."""
    return F.log_softmax(logits.float(), dim=-1)


@torch.no_grad()
def score_rows(model, rows, device, autocast, batch_rows=32, keep=None, on_batch=None):
    """[(sum of the continuation's log probabilities, greedy)] for every row, where greedy
    says the likeliest token was the right one at every continuation position. `keep`,
    a list, receives each batch's (positions, vocabulary) log probabilities (for tests)."""
    order = sorted(range(len(rows)), key=lambda r: -len(rows[r][0]))
    out = [None] * len(rows)
    for start in range(0, len(order), batch_rows):
        chunk = order[start : start + batch_rows]
        width = len(rows[chunk[0]][0]) - 1
        x = torch.zeros(len(chunk), width, dtype=torch.int64)
        y = torch.full((len(chunk), width), -1, dtype=torch.int64)  # -1: a context position
        for i, r in enumerate(chunk):
            tokens, n = rows[r]
            t = torch.tensor(tokens, dtype=torch.int64)
            x[i, : len(t) - 1] = t[:-1]
            y[i, len(t) - 1 - n : len(t) - 1] = t[len(t) - n :]
        x, y = x.to(device), y.to(device)
        with autocast:
            logits, _ = model(x, y)  # the output layer on the scored positions only: (N, vocab)
        scored = y >= 0
        logp = vocabulary_log_probs(logits.reshape(-1, logits.size(-1)))
        if logp.size(0) != int(scored.sum()):  # every position scored: forward kept them all
            logp = logp[scored.flatten()]
        if keep is not None:
            keep.append(logp)
        targets = y[scored]
        token_logp = logp.gather(1, targets[:, None])[:, 0]
        right = logp.argmax(1) == targets
        row_of = scored.nonzero()[:, 0]  # the chunk row of each scored position
        sums = torch.zeros(len(chunk), device=logp.device).index_add_(0, row_of, token_logp)
        wrong = torch.zeros(len(chunk), device=logp.device).index_add_(0, row_of, (~right).float())
        for i, r in enumerate(chunk):
            out[r] = (float(sums[i]), bool(wrong[i] == 0))
        if on_batch is not None:
            on_batch(len(chunk))
    return out


def is_chat_model(model, tokenizer):
    return chat_vocabulary(model.config.vocab_size, tokenizer.vocab_size) is not None


def letter_ids(tokenizer, n):
    """The token id of each of the first n letters, alone; UserError when one is not a single
    token, or when n answers outrun the letters (the item could not be answered past them)."""
    if n > len(LETTERS):
        raise UserError(f"more answers ({n}) than the letters {LETTERS[0]} to {LETTERS[-1]} to answer with")
    ids = []
    for letter in LETTERS[:n]:
        encoded = tokenizer.encode(letter)
        if len(encoded) != 1:
            raise UserError(f"the letter {letter} is not one token")
        ids.append(encoded[0])
    return ids


def chat_question(item):
    """The user turn of a multiple-choice item: the question, its lettered answers, the ask."""
    lines = [item.question, *(f"{L}. {o}" for L, o in zip(LETTERS, item.options))]
    return "\n".join(lines) + "\nAnswer with the letter of the right answer."


def choice_prompt(tokenizer, item, block_size):
    """The chat prompt of a multiple-choice item; UserError when a letter of its answers
    cannot be read as one token, or its answers outrun the letters."""
    letter_ids(tokenizer, len(item.options))
    return chat_prompt(tokenizer, chat_question(item), block_size)


def chat_prompt(tokenizer, text, block_size):
    ids = prompt_ids([{"role": "user", "content": text}], tokenizer.encode, tokenizer.vocab_size)
    return ids[-block_size:]


@torch.no_grad()
def last_logits(model, prompts, device, autocast):
    """The next-token logits after each prompt (a list of id lists), in one forward pass."""
    width = max(len(p) for p in prompts)
    x = torch.zeros(len(prompts), width, dtype=torch.int64)
    for i, p in enumerate(prompts):
        x[i, : len(p)] = torch.tensor(p)
    with autocast:
        logits, _ = model(x.to(device))  # right-padded: a causal model's earlier positions ignore the padding
    last = torch.tensor([len(p) - 1 for p in prompts], device=logits.device)
    return logits[torch.arange(len(prompts), device=logits.device), last].float()


@torch.no_grad()
def generate_greedy(model, prompt, max_new, stop_ids, stop_texts, decode, device, autocast):
    """The text greedy decoding writes after `prompt`, up to a stop token or one of stop_texts."""
    from gptkit.generation.generate import generate_stream

    idx = torch.tensor([prompt], device=device)
    written = []
    with autocast:
        for token in generate_stream(model, idx, max_new, temperature=0, stop_tokens=stop_ids or None):
            token = int(token)
            if token in stop_ids:
                break
            written.append(token)
            text = decode(written)
            if any(s in text for s in stop_texts):
                return min((text.split(s, 1)[0] for s in stop_texts if s in text), key=len)
    return decode(written)


def base_number_answers(model, tokenizer, items, block_size, device, autocast, max_new=256, on_item=None):
    """GSM8K for a base model: the text written after each item's prompt."""
    answers = []
    for item in items:
        prompt = tokenizer.encode(item.pairs[0][0])[-block_size:]  # past the block, generation slides
        stops = [tokenizer.eot_id] if tokenizer.eot_id is not None else []
        answers.append(generate_greedy(model, prompt, max_new, stops, ("\n\n", "Question:"), tokenizer.decode,
                                       device, autocast))
        if on_item is not None:
            on_item(1)
    return answers


def chat_number_answers(model, tokenizer, items, block_size, device, autocast, max_new=256, on_item=None):
    """GSM8K for a chat model: its reply to each question, read to <|end|> (a model trained
    on tool calls replies through sample.py --chat's loop, its calls run by the calculator)."""
    if "<|call|>" in chat_vocabulary(model.config.vocab_size, tokenizer.vocab_size):
        return tool_number_answers(model, tokenizer, items, device, autocast, max_new, on_item)
    turns = turn_ids(tokenizer.vocab_size)
    answers = []
    for item in items:
        prompt = chat_prompt(tokenizer, item.question, block_size)
        answers.append(generate_greedy(model, prompt, max_new, list(turns.values()), (), tokenizer.decode, device,
                                       autocast))
        if on_item is not None:
            on_item(1)
    return answers


def tool_number_answers(model, tokenizer, items, device, autocast, max_new=256, on_item=None):
    """Each question's reply from gptkit/generation/chat_session.py's `reply`, greedy: a call
    the model closes runs, its output forced in (the reply's last number is read, after it).
    A question too long for the context is answered by nothing."""
    from gptkit.generation.chat_session import Greedy, Session, reply

    answers = []
    for item in items:
        try:
            with autocast:
                answers.append(reply(Session(model, tokenizer), item.question, Greedy(max_new), device))
        except UserError:  # longer than the context: no reply
            answers.append("")
        if on_item is not None:
            on_item(1)
    return answers


def chat_choices(model, tokenizer, items, block_size, device, autocast, batch_rows=32, on_item=None):
    """For a chat model: the index of the letter each question's reply starts with, of its answers' letters."""
    prompts = [choice_prompt(tokenizer, item, block_size) for item in items]
    picks = []
    for start in range(0, len(items), batch_rows):
        logits = last_logits(model, prompts[start : start + batch_rows], device, autocast)
        for row, item in zip(logits, items[start : start + batch_rows]):
            ids = letter_ids(tokenizer, len(item.options))
            picks.append(int(row[ids].argmax()))
        if on_item is not None:
            on_item(len(logits))
    return picks
