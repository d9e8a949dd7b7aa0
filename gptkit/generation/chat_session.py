"""sample.py --chat: a conversation with a chat-trained model in the terminal.

    python sample.py --out_dir=out-chat --chat
    python sample.py --out_dir=out-chat --chat --system "You answer in one word." --temperature 0
    printf 'what is 2+3?\nand 7+5?\n' | python sample.py --out_dir=out-chat --chat   # one reply a line

Each user line joins the history as a turn of the template (gptkit/data/chat.py); the
model is given the history and <|assistant|>, and its reply streams until it writes
<|end|> (or any turn token, or max_new_tokens). When the history no longer fits the
context window with room for a reply (min(max_new_tokens, block_size / 2) tokens),
the oldest turns are dropped (the system message stays). Ctrl-D (end of input) leaves.

A model trained on tool calls (docs/chat.md) may call the calculator mid-reply: when it
writes <|/call|>, gptkit/generation/tools.py's calculator runs on the call's expression,
its output goes into the reply as tokens (<|output|> ... <|/output|>, shown as they are),
and the model goes on from there. `--tools none` leaves the model to write on alone.
"""

import dataclasses
import sys

import torch

from gptkit.data.chat import TURN_TOKENS, chat_vocabulary, prompt_ids, reply_messages
from gptkit.generation import tools
from gptkit.generation.generate import TextStream, generate_samples, generate_stream, make_decoder
from gptkit.ops.errors import UserError

TOOL_CHOICES = ("calculator", "none")  # --tools


@dataclasses.dataclass
class Session:
    """The model, its tokenizer and the conversation so far."""

    model: object
    tokenizer: object
    system: str | None = None
    history: list = dataclasses.field(default_factory=list)  # user, assistant and tool messages, oldest first
    tools: str = "calculator"  # what a tool call runs: "calculator", or "none" (the model writes on alone)

    def __post_init__(self):
        base = self.tokenizer.vocab_size
        self.ids = chat_vocabulary(self.model.config.vocab_size, base)  # the turn ids; None: not chat
        if self.ids is None:
            raise UserError(
                f"this model is not chat-trained: it has {self.model.config.vocab_size:,} token ids, its tokenizer "
                f"{base:,}, and a chat model has the {len(TURN_TOKENS)} turn tokens after them; fine-tune it on a "
                "chat dataset first (docs/chat.md)"
            )
        if self.tools not in TOOL_CHOICES:
            raise UserError(f"--tools must be one of {', '.join(TOOL_CHOICES)}, got {self.tools!r}")
        if self.system is not None:
            self.tokenizer.encode(self.system)  # a character outside a char vocabulary fails now, in one line

    @property
    def has_tool_tokens(self):
        """Whether the model was trained with tool calls (its vocabulary has the tool tokens)."""
        return "<|call|>" in self.ids

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
            history = without_first_exchange(history)
        if len(ids) >= block:
            raise UserError(f"this message and the system prompt take {len(ids)} tokens, more than the model's "
                            f"context of {block}: write a shorter one")
        self.history = history
        return ids


@dataclasses.dataclass(frozen=True)
class Greedy:
    """Sampling settings for `reply` that eval.py uses: greedy, cached, one sample."""

    max_new_tokens: int
    num_samples: int = 1
    seed: int = 0
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float = 1.0
    stop: str | None = None
    use_cache: bool = True
    shift_context: bool = True
    compile: bool = False


def without_first_exchange(history):
    """The history without its oldest exchange: a user message and the reply's messages
    (an assistant's, with its tool calls and their outputs) up to the next user message;
    the last message always stays."""
    nexts = [i for i, m in enumerate(history) if i > 0 and m["role"] == "user"]
    return history[nexts[0]:] if nexts else history[-1:]


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
    turns = [session.ids[name] for name in TURN_TOKENS]  # a reply goes on through its tool tokens
    stops = turns + ([session.tokenizer.eot_id] if session.tokenizer.eot_id is not None else [])
    return ids, stops


def reply(session, text, cfg, device, on_text=None, turn=0, decoder=None, info=None):
    """The model's answer to the user's `text` (streamed to on_text); both join the history.
    cfg.stop, when set, ends the reply before that string; decoder and info go to
    generate_samples. A model with tool tokens replies through tool_reply; info then
    gets "calls" too."""
    ids, stops = reply_prompt(session, text, cfg.max_new_tokens)
    settings = dataclasses.replace(cfg, num_samples=1, seed=cfg.seed + turn)
    if session.has_tool_tokens:
        answer, messages = tool_reply(session, ids, stops, settings, device, on_text, decoder, info)
        session.history += messages
        return answer
    (answer,) = generate_samples(session.model, session.tokenizer, ids, settings, device, on_text=on_text,
                                 stop_tokens=stops, decoder=decoder, info=info)
    session.history.append({"role": "assistant", "content": answer})
    return answer


def tool_reply(session, ids, stops, cfg, device, on_text=None, decoder=None, info=None):
    """(the reply's text, its messages) for a model with tool tokens: generated as
    generate_samples does (one sample, one seeded generator for the whole reply), and
    each time it closes a call, the calculator's output forced in as tokens (unless
    session.tools is "none") before generation goes on from the reply so far. The text
    shows the tool tokens as their markers; the messages are the reply in the messages
    form (gptkit/data/chat.py's reply_messages). A dict `info` gets "new_tokens" (those
    the model wrote), "stopped" and "calls" ([{"expression", "output"}])."""
    tokenizer, special = session.tokenizer, session.ids
    generator = torch.Generator(device=device)
    generator.manual_seed(cfg.seed)
    stream = TextStream(tokenizer, cfg.stop, stops)
    decoder = decoder if decoder is not None else make_decoder(session.model, cfg, batch_size=1)
    pause = [special["<|/call|>"]] if session.tools != "none" else []  # where generation stops for the tool
    show = on_text or (lambda text: None)
    tokens, calls, written = list(ids), [], 0  # written: the model's tokens, at most cfg.max_new_tokens
    while written < cfg.max_new_tokens:
        new = generate_until(session.model, tokens, cfg, device, generator, decoder, [*stops, *pause], stream, show,
                             cfg.max_new_tokens - written)
        written += len(new)
        if not new or new[-1] not in pause or stream.stopped:
            break
        call = tools.run_call(tokens[len(ids):], tokenizer, special)  # the output, forced in
        calls.append({"expression": call["expression"], "output": call["output"]})
        tokens += call["ids"]
        for token in call["ids"]:
            stream.push(token)
        show(stream.take_new())
    stream.close()
    show(stream.take_new())
    if info is not None:
        info.update(new_tokens=written, stopped=stream.stopped, calls=calls)
    return stream.text, reply_messages(tokens[len(ids):], tokenizer.decode, tokenizer.vocab_size)


def generate_until(model, tokens, cfg, device, generator, decoder, stops, stream, show, budget):
    """The tokens the model writes after `tokens` (appended to it and pushed into `stream`,
    its new text shown) until one of `stops`, the stream's stop string or `budget` tokens."""
    steps = generate_stream(model, torch.tensor([tokens], device=device), budget, temperature=cfg.temperature,
                            top_k=cfg.top_k, top_p=cfg.top_p, min_p=cfg.min_p,
                            repetition_penalty=cfg.repetition_penalty, generator=generator, use_cache=cfg.use_cache,
                            shift_context=cfg.shift_context, decoder=decoder, stop_tokens=stops)
    new = []
    try:
        for step in steps:
            new.append(int(step[0]))
            stream.push(new[-1])
            show(stream.take_new())
            if stream.stopped or new[-1] in stops:
                break
    finally:
        steps.close()
    tokens += new
    return new


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
