"""Generate text in batches with the KV cache, streamed as it comes.

One sample's tokens become text through a TextStream, which waits for whole UTF-8
characters and cuts the text before a stop string."""

import torch

REPLACEMENT = "\ufffd"  # what decoding prints for incomplete UTF-8
MAX_PENDING = 4  # a UTF-8 character is at most 4 bytes, and every BPE token holds at least one


def held_back(text, stop):
    """Length of the longest end of `text` that could be the start of `stop`: that
    much must wait, since the next tokens may complete the stop string."""
    for k in range(min(len(stop) - 1, len(text)), 0, -1):
        if text.endswith(stop[:k]):
            return k
    return 0


class TextStream:
    """One sample's text, built token by token.

    BPE may split one character's UTF-8 bytes across tokens; decoding them alone
    prints U+FFFD, so tokens wait in `pending` until they decode to whole
    characters. The text ends before the first occurrence of `stop`."""

    def __init__(self, tokenizer, stop=None):
        self.tokenizer, self.stop = tokenizer, stop
        self.pending = []  # tokens not yet turned into text
        self.text = ""
        self.shown = 0  # how much of text take_new() has handed out
        self.stopped = False  # the stop string was found
        self.closed = False  # no more tokens will come

    def push(self, token):
        if self.stopped:
            return
        if token == self.tokenizer.eot_id:  # a BPE model ended its document
            self.close()
            self.stopped = True
            return
        self.pending.append(token)
        piece = self.tokenizer.decode(self.pending)
        if piece.endswith(REPLACEMENT) and len(self.pending) < MAX_PENDING:
            return  # maybe half a character: wait for the next token
        self.pending = []
        self._append(piece)

    def _append(self, piece):
        search_from = max(0, len(self.text) - len(self.stop) + 1) if self.stop else 0
        self.text += piece
        if self.stop:
            found = self.text.find(self.stop, search_from)
            if found >= 0:
                self.text, self.stopped = self.text[:found], True

    def close(self):
        if self.pending and not self.stopped:
            self._append(self.tokenizer.decode(self.pending))
        self.pending, self.closed = [], True

    def take_new(self):
        """The text not handed out yet, minus a tail that may begin the stop string."""
        end = len(self.text)
        if self.stop and not (self.stopped or self.closed):
            end -= held_back(self.text, self.stop)
        new, self.shown = self.text[self.shown:end], max(self.shown, end)
        return new


def generate_samples(model, tokenizer, prompt_ids, cfg, device, on_text=None):
    """Generate cfg.num_samples continuations of `prompt_ids` together as one batch.

    Returns the text of each sample (without the prompt), cut before cfg.stop.
    `on_text(piece)` is called with sample 1's new text as it is generated."""
    generator = torch.Generator(device=device)
    generator.manual_seed(cfg.seed)
    idx = torch.tensor([prompt_ids] * cfg.num_samples, dtype=torch.long, device=device)  # (B, T)
    streams = [TextStream(tokenizer, cfg.stop) for _ in range(cfg.num_samples)]
    with torch.no_grad():
        steps = model.generate_stream(
            idx, cfg.max_new_tokens, temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
            min_p=cfg.min_p, repetition_penalty=cfg.repetition_penalty, generator=generator,
            use_cache=cfg.use_cache, shift_context=cfg.shift_context,
            stop_tokens=None if tokenizer.eot_id is None else [tokenizer.eot_id],
        )
        try:
            for tokens in steps:  # (B,) the next token of every sample
                for stream, token in zip(streams, tokens.tolist()):
                    stream.push(token)
                if on_text is not None:
                    on_text(streams[0].take_new())
                if all(s.stopped for s in streams):
                    break  # every sample reached the stop string: no need to go on
        finally:
            steps.close()
    for stream in streams:
        stream.close()
    if on_text is not None:
        on_text(streams[0].take_new())
    return [s.text for s in streams]
