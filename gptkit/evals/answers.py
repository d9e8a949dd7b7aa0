"""eval.py --answers: how often a chat model's reply ends with the right final answer, the
model replying as sample.py --chat does, its tool calls run (calculator) or not (none).

    python eval.py out-chat-multiply --dataset multiply_tools --answers calculator
    python eval.py out-chat-multiply --dataset multiply_tools --answers none
    python eval.py out-chat-multiply-plain --dataset multiply_plain --answers none

Each conversation of the split is asked its last user message, after the messages before
it; the reply is generated greedily through gptkit/generation/chat_session.py's `reply`
(so a call closes, the calculator runs, its output is forced in, the reply goes on),
and its final text (after its last tool output) must equal the reference's exactly.
Unlike --exact_match, the reply's calls are not compared: a model trained without tool
calls and one trained with them answer the same questions (multiply_plain and
multiply_tools ask the same ones) and are scored alike.
"""

import numpy as np

from gptkit.data import dataset
from gptkit.data.chat import chat_vocabulary, reply_messages
from gptkit.ops.errors import UserError


def conversation_messages(ids, tokenizer, special):
    """One conversation's ids (a chat bin's) back as messages: each turn's content, an
    assistant's turn with its calls and outputs (gptkit/data/chat.py's reply_messages)."""
    role_of = {special[f"<|{role}|>"]: role for role in ("system", "user", "assistant")}
    messages, i = [], 0
    while i < len(ids):
        end = ids.index(special["<|end|>"], i)
        role, body = role_of[ids[i]], ids[i + 1 : end]
        if role == "assistant":
            messages += reply_messages(body, tokenizer.decode, tokenizer.vocab_size)
        else:
            messages.append({"role": role, "content": tokenizer.decode(body)})
        i = end + 1
    return messages


def questions(data_dir, name, split, tokenizer, limit=None):
    """(messages before the last user message, that message, the reference's final text) of
    each conversation of a chat split (its first `limit`)."""
    from gptkit.data.chat_batches import conversations_of

    meta = dataset.load_meta(data_dir, name)
    if "chat" not in meta:
        raise UserError(f"--answers asks a chat dataset's questions; {name} is plain text")
    if meta["tokenizer"] != tokenizer.to_dict():
        raise UserError(f"the model's tokenizer is not chat dataset {name}'s: fine-tune it there first")
    special = chat_vocabulary(meta["vocab_size"], meta["chat"]["turn_ids"]["<|system|>"])  # the base's size
    folder = dataset.dataset_dir(data_dir, name)
    ids = np.fromfile(folder / f"{split}.bin", dtype=meta["dtype"])
    mask = np.fromfile(folder / f"{split}_mask.bin", dtype=np.uint8)
    out = []
    for conv, _ in conversations_of(ids, mask)[:limit]:
        messages = conversation_messages(conv, tokenizer, special)
        last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
        out.append((messages[:last_user], messages[last_user]["content"], messages[-1]["content"]))
    return out


def answer_exact(model, tokenizer, data_dir, name, split, tools, device, limit=None):
    """(replies whose final text is the reference's, questions asked): --answers."""
    from gptkit.generation.chat_session import Greedy, Session, reply

    asked = questions(data_dir, name, split, tokenizer, limit)
    if chat_vocabulary(model.config.vocab_size, tokenizer.vocab_size) is None:
        raise UserError("--answers asks a chat model: this one has no turn tokens")
    exact = 0
    model.to(device).eval()
    try:
        for history, text, reference in asked:
            system = history[0]["content"] if history and history[0]["role"] == "system" else None
            session = Session(model, tokenizer, system, [m for m in history if m["role"] != "system"], tools=tools)
            reply(session, text, Greedy(max_new_tokens=max(1, model.config.block_size // 2)), device)
            exact += session.history[-1]["content"] == reference
    finally:
        model.to("cpu")
    return exact, len(asked)
