"""sample.py --chat: a conversation with a chat-trained model in the terminal.

    python sample.py --out_dir=out-chat --chat
    python sample.py --out_dir=out-chat --chat --system "You answer in one word." --temperature 0
    printf 'what is 2+3?\nand 7+5?\n' | python sample.py --out_dir=out-chat --chat   # one reply a line

Each user line joins the history as a turn of the template (gptkit/data/chat.py); the
model is given the history and <|assistant|>, and its reply streams until it writes
<|end|> (or any turn token, or max_new_tokens). When the history no longer fits the
context window with room for a reply (min(max_new_tokens, block_size / 2) tokens),
the oldest turns are dropped (the system message stays). Ctrl-D (end of input) leaves.
"""

import dataclasses
import sys

from gptkit.data.chat import TURN_TOKENS, chat_vocabulary, prompt_ids
from gptkit.ops.errors import UserError
from gptkit.generation.generate import generate_samples


@dataclasses.dataclass
class Session:
    """The model, its tokenizer and the conversation so far."""

    model: object
    tokenizer: object
    system: str | None = None
    history: list = dataclasses.field(default_factory=list)  # user and assistant messages, oldest first

    def __post_init__(self):
        base = self.tokenizer.vocab_size
        self.ids = chat_vocabulary(self.model.config.vocab_size, base)  # the turn ids; None: not chat
        if self.ids is None:
            raise UserError(
                f"this model is not chat-trained: it has {self.model.config.vocab_size:,} token ids, its tokenizer "
                f"{base:,}, and a chat model has the {len(TURN_TOKENS)} turn tokens after them; fine-tune it on a "
                "chat dataset first (docs/chat.md)"
            )
        if self.system is not None:
            self.tokenizer.encode(self.system)  # a character outside a char vocabulary fails now, in one line

    def messages(self, history=None):
        system = [{"role": "system", "content": self.system}] if self.system else []
        return system + (self.history if history is None else history)

    def prompt(self, room):
        """The prompt for the next reply, the oldest turns dropped until it leaves `room` tokens
        free. A last message too long for the context is a UserError that leaves the history
        as it was (the conversation goes on without that message)."""
        block = self.model.config.block_size
        history = self.history
        while True:
            ids = prompt_ids(self.messages(history), self.tokenizer.encode, self.tokenizer.vocab_size)
            if len(ids) + room <= block or len(history) <= 1:
                break
            history = history[2:] if history[0]["role"] == "user" and len(history) > 2 else history[1:]
        if len(ids) >= block:
            raise UserError(f"this message and the system prompt take {len(ids)} tokens, more than the model's "
                            f"context of {block}: write a shorter one")
        self.history = history
        return ids


def reply_prompt(session, text, max_new_tokens):
    """(prompt ids, stop tokens) of the model's answer to the user's `text`, which joins
    the history; the oldest turns are dropped to leave room for min(max_new_tokens,
    block_size / 2) new tokens. serve.py's batches start each chat reply from here."""
    session.tokenizer.encode(text)  # unknown characters: a UserError before the history changes
    session.history.append({"role": "user", "content": text})
    block = session.model.config.block_size
    room = max(1, min(max_new_tokens, block // 2))
    try:
        ids = session.prompt(room)
    except UserError:
        session.history.pop()
        raise
    stops = [*session.ids.values()] + ([session.tokenizer.eot_id] if session.tokenizer.eot_id is not None else [])
    return ids, stops


def reply(session, text, cfg, device, on_text=None, turn=0, decoder=None, info=None):
    """The model's answer to the user's `text` (streamed to on_text); both join the history.
    cfg.stop, when set, ends the reply before that string; decoder and info go to
    generate_samples."""
    ids, stops = reply_prompt(session, text, cfg.max_new_tokens)
    settings = dataclasses.replace(cfg, num_samples=1, seed=cfg.seed + turn)
    (answer,) = generate_samples(session.model, session.tokenizer, ids, settings, device, on_text=on_text,
                                 stop_tokens=stops, decoder=decoder, info=info)
    session.history.append({"role": "assistant", "content": answer})
    return answer


def read_line(lines, number):
    """The next line of a pipe or file without its line end (\\n, or a Windows file's \\r\\n),
    None at its end; a line that is not UTF-8 is a UserError naming it."""
    raw = lines.buffer.readline() if hasattr(lines, "buffer") else lines.readline()
    if not raw:
        return None
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UserError(f"standard input, line {number}: not UTF-8 text ({e.reason} at byte {e.start + 1})") from None
    return raw.removesuffix("\n").removesuffix("\r")


def talk(session, cfg, device, lines=sys.stdin, write=print):
    """The conversation loop: in a terminal, a prompt and a streamed reply per line; from a
    pipe or file, one reply a line on stdout and errors as for any command."""
    interactive = lines.isatty()
    if interactive:
        print("chat: type a message and press Enter; Ctrl-D leaves", file=sys.stderr)
    turn, number = 0, 1
    while True:
        if interactive:
            try:
                text = input("> ")
            except EOFError:
                print(file=sys.stderr)
                return 0
            except UnicodeDecodeError as e:
                print(f"error: that line is not UTF-8 text ({e.reason}): type it again", file=sys.stderr)
                continue
        else:
            text = read_line(lines, number)
            if text is None:
                return 0
            number += 1
        if not text.strip():
            continue
        try:
            reply(session, text, cfg, device, on_text=write, turn=turn)
        except UserError as e:
            if not interactive:
                raise
            print(f"error: {e}", file=sys.stderr)  # in a terminal the conversation goes on
            continue
        write("\n")
        turn += 1
