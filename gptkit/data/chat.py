"""Chat conversations as tokens: the template (and its Jinja form for exports), the target
mask, the reader of jsonl conversations (a trained model grows room for the turn tokens
with model.py's GPT.grow_vocab).

A conversation is a list of messages `{"role": "system"|"user"|"assistant", "content": "..."}`.
Each message becomes its role's turn token, its content encoded as plain text, and the
end-of-turn token:

    <|system|> You are terse. <|end|> <|user|> 2+2? <|end|> <|assistant|> 4 <|end|>

The turn tokens are real ids, never strings: for GPT-2 BPE they are added after its
50,257 ids (50257..50260), for our own BPE and characters after the vocabulary. Content
is encoded as ordinary text, so a message that contains the text "<|user|>" stays text
and cannot open a turn. The targets (mask 1) are an assistant's content and its <|end|>;
everything else (the turn tokens, system and user content) is context (mask 0).

A reply may call a tool (gptkit/generation/tools.py's calculator) in the messages form
of OpenAI's API: an assistant message with "tool_calls", a "tool" message with the
result, then the assistant's message going on. They make one assistant turn, marked by
four more special ids after the turn tokens (only in a dataset or model that has them):

    <|assistant|> <|call|> 1234*5678 <|/call|> <|output|> 7006652 <|/output|> 7006652 <|end|>

The call (<|call|>, its expression, <|/call|>) is a target: the model learns when to
call; the output and its markers are context (mask 0): the tool writes them, and at
generation they are forced into the reply (docs/chat.md).

    python prepare.py talks --input talks.jsonl --format chat
"""

import json
import re
import stat
import sys
from pathlib import Path

from gptkit.ops.errors import UserError

ROLES = ("system", "user", "assistant", "tool")
TURN_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
TOOL_TOKENS = ("<|call|>", "<|/call|>", "<|output|>", "<|/output|>")  # after the turn tokens, when a model has them
CHAT_TOKENS = TURN_TOKENS + TOOL_TOKENS
TOOL = "calculator"  # the one tool a call may name
TEMPLATE = "gptkit-chat-1"


# The template as Jinja, for exports (transformers' apply_chat_template, llama.cpp's
# tokenizer.chat_template): the turn tokens' text around each message's content, and
# <|assistant|> to ask for a reply; an assistant message after a tool's goes on in the
# same turn, its calls between <|call|> and <|/call|> (arguments as an object, the form
# transformers' templates take), a tool's content between <|output|> and <|/output|>.
# Both tokenize its text with the special tokens, which gives exactly
# encode_conversation's / prompt_ids's ids; unlike ours, they would also read a marker
# typed inside a message as a turn (docs/chat.md).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}{{ '<|output|>' + message['content'] + '<|/output|>' }}"
    "{% else %}"
    "{% if message['role'] != 'assistant' or loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}"
    "{{ '<|' + message['role'] + '|>' }}{% endif %}"
    "{{ message['content'] or '' }}"
    "{% for call in message.get('tool_calls') or [] %}"
    "{{ '<|call|>' + call['function']['arguments']['expression'] + '<|/call|>' }}"
    "{% endfor %}"
    "{% if not message.get('tool_calls') %}{{ '<|end|>' }}{% endif %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def chat_vocabulary(model_vocab_size, base_vocab_size):
    """The special ids of a chat model, whose vocabulary is its tokenizer's, then the turn
    tokens, then (a model trained on tool calls) the tool tokens: {name: id}; None for any
    other model."""
    extra = model_vocab_size - base_vocab_size
    if extra not in (len(TURN_TOKENS), len(CHAT_TOKENS)):
        return None
    return special_ids(base_vocab_size, tools=extra == len(CHAT_TOKENS))


def turn_ids(base_vocab_size):
    """The ids of <|system|>, <|user|>, <|assistant|>, <|end|>: the first ids after the base vocabulary."""
    return {name: base_vocab_size + i for i, name in enumerate(TURN_TOKENS)}


def tool_ids(base_vocab_size):
    """The ids of <|call|>, <|/call|>, <|output|>, <|/output|>: the ids after the turn tokens."""
    return {name: base_vocab_size + len(TURN_TOKENS) + i for i, name in enumerate(TOOL_TOKENS)}


def special_ids(base_vocab_size, tools):
    """Every special id of a chat vocabulary: the turn tokens', and the tool tokens' if `tools`."""
    return turn_ids(base_vocab_size) | (tool_ids(base_vocab_size) if tools else {})


def has_tool_calls(messages):
    return any(m["role"] == "tool" or m.get("tool_calls") for m in messages)


def check_chat_meta(meta, base_vocab_size, source):
    """The number of special tokens a chat meta.json (or checkpoint) adds to its tokenizer's
    vocabulary (the turn tokens, and the tool tokens if it has "tool_ids"), after checking
    its "chat" entry: a UserError naming `source` otherwise."""
    chat = meta.get("chat")
    if not isinstance(chat, dict) or chat.get("template") != TEMPLATE:
        raise UserError(f"{source}: its \"chat\" entry is not this code's template {TEMPLATE}: run prepare.py again")
    if chat.get("turn_ids") != turn_ids(base_vocab_size):
        raise UserError(f"{source}: its turn ids {chat.get('turn_ids')} are not the {len(TURN_TOKENS)} ids after "
                        f"its {base_vocab_size}-token vocabulary: run prepare.py again")
    if "tool_ids" in chat and chat["tool_ids"] != tool_ids(base_vocab_size):
        raise UserError(f"{source}: its tool ids {str(chat['tool_ids'])[:200]} are not the {len(TOOL_TOKENS)} ids "
                        "after its turn tokens: run prepare.py again")
    return len(CHAT_TOKENS) if "tool_ids" in chat else len(TURN_TOKENS)


def call_expression(call):
    """The calculator's expression of one checked tool call (its arguments an object or a JSON string)."""
    arguments = call["function"]["arguments"]
    return (json.loads(arguments) if isinstance(arguments, str) else arguments)["expression"]


def continues_turn(messages, i):
    """Whether message i goes on with the assistant's turn: an assistant message after a tool's output."""
    return messages[i]["role"] == "assistant" and i > 0 and messages[i - 1]["role"] == "tool"


def encode_conversation(messages, encode, base_vocab_size):
    """(ids, mask) of one conversation: lists of equal length, mask 1 on the targets.
    A tool's message is context inside the assistant's turn, which goes on after it."""
    ids_of = special_ids(base_vocab_size, tools=True)
    ids, mask = [], []

    def add(tokens, target):
        ids.extend(tokens)
        mask.extend([target] * len(tokens))

    for i, m in enumerate(messages):
        if m["role"] == "tool":
            add([ids_of["<|output|>"], *encode(m["content"]), ids_of["<|/output|>"]], 0)
            continue
        target = 1 if m["role"] == "assistant" else 0
        if not continues_turn(messages, i):
            add([ids_of[f"<|{m['role']}|>"]], 0)
        add(encode(m.get("content") or ""), target)
        for call in m.get("tool_calls") or []:
            add([ids_of["<|call|>"], *encode(call_expression(call)), ids_of["<|/call|>"]], target)
        if not m.get("tool_calls"):
            add([ids_of["<|end|>"]], target)
    return ids, mask


def prompt_ids(messages, encode, base_vocab_size):
    """The tokens a model is given to write the next assistant turn: the history, then <|assistant|>."""
    ids, _ = encode_conversation(messages, encode, base_vocab_size)
    return ids + [turn_ids(base_vocab_size)["<|assistant|>"]]


def calculator_call(expression):
    """One tool call of an assistant message, in OpenAI's form."""
    return {"type": "function", "function": {"name": TOOL, "arguments": json.dumps({"expression": expression})}}


def reply_messages(tokens, decode, base_vocab_size):
    """The messages of one generated assistant turn (its tokens after <|assistant|>, up to
    a turn token): its text, its calls and their outputs as encode_conversation writes
    them, ending with an assistant message. What is not well formed (a call never closed,
    an output never given) is kept as far as it went: text as text, a call without an
    output answered by an empty one."""
    names = {i: name for name, i in special_ids(base_vocab_size, tools=True).items()}
    messages, current, part, pending = [], {"role": "assistant", "content": ""}, [], 0  # pending: calls unanswered
    for token in tokens:
        name = names.get(token)
        if name is None:
            part.append(token)
            continue
        if name in ("<|call|>", "<|output|>") or (name == "<|/output|>" and not pending):
            current["content"] += decode(part)  # before a call or an output (or one nobody asked for): text
        elif name == "<|/call|>":
            current.setdefault("tool_calls", []).append(calculator_call(decode(part)))
            pending += 1
        elif name == "<|/output|>":
            if current.get("tool_calls"):
                messages.append(current)
                current = {"role": "assistant", "content": ""}
            messages.append({"role": "tool", "content": decode(part)})
            pending -= 1
        else:  # a turn token: the turn is over
            break
        part = []
    current["content"] += decode(part)
    if current.get("tool_calls"):
        messages.append(current)
        current = {"role": "assistant", "content": ""}
    return messages + [{"role": "tool", "content": ""}] * pending + [current]  # calls never answered: by nothing


TOOL_MARKER = re.compile("(" + "|".join(re.escape(t) for t in TOOL_TOKENS) + ")")


def marked_reply_messages(text, base_vocab_size):
    """The messages of a reply given back as text with its tool tokens' markers (a client
    sending the reply serve.py wrote, "<|call|>2*3<|/call|><|output|>6<|/output|>6"):
    reply_messages over the text's pieces, the markers read as the tool tokens."""
    ids = tool_ids(base_vocab_size)
    pieces = [ids.get(piece, piece) for piece in TOOL_MARKER.split(text) if piece]
    return reply_messages(pieces, "".join, base_vocab_size)


def check_conversation(record):
    """The messages of one parsed jsonl line, or a UserError saying what is wrong with it
    (an assistant message with tool calls may have no content: it is given "")."""
    if not isinstance(record, dict) or not isinstance(record.get("messages"), list) or not record["messages"]:
        raise UserError('no "messages" list (expected {"messages": [{"role": ..., "content": ...}]})')
    messages = []
    for i, m in enumerate(record["messages"], 1):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or m["role"] not in ROLES:
            role = m.get("role") if isinstance(m, dict) else None
            raise UserError(f"message {i} has unknown role {str(role)[:40]!r} (expected one of {', '.join(ROLES)})")
        if m.get("tool_calls") is not None:
            m = check_tool_calls(m, i)
        if not isinstance(m.get("content"), str):
            raise UserError(f"message {i} has no text content")
        bad = LONE_SURROGATE.search(m["content"])
        if bad is not None:  # JSON can spell "\ud800", which is no character: no tokenizer or file can hold it
            raise UserError(f"message {i} holds a lone surrogate U+{ord(bad.group()):04X} at character {bad.start()} "
                            "(half of a UTF-16 pair, not a character)")
        if m["role"] == "assistant" and not m.get("tool_calls") and not m["content"].strip():
            raise UserError(f"message {i} is an empty assistant turn (it would have nothing to learn)")
        messages.append(m)
    check_tool_order(messages)
    if not any(m["role"] == "assistant" for m in messages):
        raise UserError("no assistant turn (it would have nothing to learn)")
    return messages


def check_tool_calls(m, i):
    """An assistant message with tool calls, its content "" if it had none, or a UserError:
    each call must be {"type": "function", "function": {"name": "calculator", "arguments":
    {"expression": "..."}}} (the arguments an object, or that object as a JSON string)."""
    calls = m["tool_calls"]
    if m["role"] != "assistant" or not isinstance(calls, list) or not calls:
        raise UserError(f"message {i}: only an assistant message has \"tool_calls\", a non-empty list of calls")
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        named = isinstance(function, dict) and function.get("name") == TOOL
        if not named or call.get("type", "function") != "function":
            raise UserError(f'message {i}: a tool call must be {{"type": "function", "function": {{"name": "{TOOL}", '
                            '"arguments": {"expression": "..."}}}} (the only tool is the calculator)')
        arguments = function.get("arguments")
        try:
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except (ValueError, RecursionError):
            arguments = None
        if not isinstance(arguments, dict) or not isinstance(arguments.get("expression"), str):
            raise UserError(f'message {i}: a calculator call\'s arguments must be {{"expression": "..."}}')
        if LONE_SURROGATE.search(arguments["expression"]) or not arguments["expression"].strip():
            raise UserError(f"message {i}: a calculator call's expression is empty or not text")
    return m if m.get("content") is not None else {**m, "content": ""}


def check_tool_order(messages):
    """Tool messages answer the calls just before them, one each, and the assistant's turn
    goes on after them: a UserError otherwise."""
    waiting = 0  # calls not answered yet
    for i, m in enumerate(messages, 1):
        if m["role"] == "tool":
            if not waiting:
                raise UserError(f"message {i} is a tool's output with no assistant tool call before it to answer")
            waiting -= 1
            continue
        if waiting or (i > 1 and messages[i - 2]["role"] == "tool" and m["role"] != "assistant"):
            raise UserError(f"message {i}: after an assistant's tool calls come their outputs (one \"tool\" "
                            "message each), then the assistant's reply goes on")
        waiting = len(m.get("tool_calls") or [])
    if waiting or messages[-1]["role"] == "tool":
        raise UserError("the conversation ends inside a tool call: its outputs and the assistant's reply "
                        "must follow")


LONE_SURROGATE = re.compile("[\ud800-\udfff]")
BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark, which some editors put at the start of a file
STDIN = "-"
CHAT_SUFFIXES = (".jsonl", ".json")  # Hugging Face's to_json() writes jsonl under either name


def parse_line(raw):
    """The messages of one raw line (bytes, without its \\n), or a UserError saying why not:
    invalid UTF-8, not JSON (nesting too deep or a number too long to read included), or
    not a conversation (check_conversation)."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"not UTF-8 text ({e.reason} at byte {e.start + 1} of the line)") from None
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise UserError(f"not JSON ({e.msg}, column {e.colno})") from None
    except RecursionError:
        raise UserError("not JSON this reader takes: nested too deeply") from None
    except ValueError as e:  # an integer of over 4,300 digits (Python's limit on int("..."))
        why = "a number of over 4,300 digits" if "digits" in str(e) else str(e).splitlines()[0][:120]
        raise UserError(f"not JSON this reader takes ({why})") from None
    return check_conversation(record)


def chat_files(path):
    """The inputs of `path`: the file itself (a pipe, /dev/fd/N or - for standard input
    included), or a folder's *.jsonl and *.json files (Hugging Face style), sorted."""
    if str(path) == STDIN:
        return [STDIN]
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except OSError:
        raise UserError(f"{path} is not a file or folder")
    if stat.S_ISDIR(mode):
        files = sorted(p for p in path.rglob("*") if p.suffix.lower() in CHAT_SUFFIXES and p.is_file())
        if not files:
            raise UserError(f"{path} holds no .jsonl or .json files of conversations")
        return files
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        raise UserError(f"{path} is a device, not a file of conversations, a pipe or -")
    return [path]


def read_lines(file):
    """(line number, raw bytes) of every line of `file` (- is standard input, read once):
    lines end at \\n only, as jsonl's do (U+2028 or U+0085 inside a message is text), a
    \\r before it is dropped (a Windows file), and a byte order mark at the start is skipped."""
    try:
        if file == STDIN:
            data = sys.stdin.buffer.read()
        else:
            with open(file, "rb") as f:
                data = f.read()
    except OSError as e:
        raise UserError(f"cannot read {file}: {e.strerror}")
    if data.startswith(BOM):
        data = data[len(BOM):]
    for number, raw in enumerate(data.split(b"\n"), 1):
        yield number, raw.removesuffix(b"\r")


def read_messages(paths, errors="raise"):
    """Every conversation's messages under `paths` (files or folders), as a list of
    (where, messages) with where = "file:line", and the number of lines skipped.

    A bad line (invalid UTF-8, not JSON, no messages, an unknown role, an empty
    assistant turn, a lone surrogate) is a UserError naming its file and line, or
    skipped and counted with errors="skip"."""
    paths = [paths] if isinstance(paths, (str, Path)) else paths
    if [str(p) for p in paths].count(STDIN) > 1:
        raise UserError("--input names - (standard input) twice: it can be read only once")
    records, skipped = [], 0
    for file in [f for path in paths for f in chat_files(path)]:
        for number, raw in read_lines(file):
            if not raw.strip():
                continue
            try:
                records.append((f"{file}:{number}", parse_line(raw)))
            except UserError as e:
                if errors != "skip":
                    raise UserError(f"{file}:{number}: {e}") from None
                skipped += 1
    return records, skipped


def encode_records(records, encode, base_vocab_size, block_size=None, errors="raise"):
    """(ids, mask) of each (where, messages) record, and how many were too long: with a
    block_size, a conversation must fit one window of block_size + 1 tokens."""
    conversations, skipped = [], 0
    for where, messages in records:
        ids, mask = encode_conversation(messages, encode, base_vocab_size)
        if block_size is not None and len(ids) > block_size + 1:
            if errors == "skip":
                skipped += 1
                continue
            raise UserError(f"{where}: {len(ids)} tokens, longer than block_size + 1 = {block_size + 1} "
                            "(use a larger --block_size, or --errors skip to leave such conversations out)")
        conversations.append((ids, mask))
    return conversations, skipped
