"""Generate text in batches with the KV cache, streamed as it comes: what sample.py runs.

model.py holds the architecture: a KVCache and `GPT.next_token_logits`, which runs
the model on the new tokens only. `generate_stream` here decides what to run each
step (the cache while the context fits, and what to do past block_size), picks the
next token with gptkit/generation/sampling.py's filters and finishes rows at stop tokens.
One sample's tokens become text through a TextStream, which waits for whole UTF-8
characters and cuts the text before a stop string.

    python sample.py --out_dir=out-shakespeare --num_samples=2 --max_new_tokens=100
    python -c "import torch, model; from gptkit.generation.generate import generate_stream; m = model.GPT(model.GPTConfig(n_layer=2, n_head=2, n_embd=64, vocab_size=50)).eval(); print([t.tolist() for t in generate_stream(m, torch.zeros(1, 3, dtype=torch.long), 5, temperature=0)])"
"""

import sys

import torch

from gptkit.fast import cpu_linears
from gptkit.data.chat import CHAT_TOKENS
from gptkit.fast.compiled_decode import CompiledDecoder
from gptkit.ops.device import inference_dtype
from gptkit.ops.errors import UserError, first_line
from gptkit.generation.sampling import check_sampling_options, choose_next_token
from model import KVCache

REPLACEMENT = "\ufffd"  # what decoding prints for incomplete UTF-8
MAX_PENDING = 4  # a UTF-8 character is at most 4 bytes, and every BPE token holds at least one


def held_back(text, stop):
    """Length of the longest end of `text` that could be the start of `stop`: that
    much must wait, since the next tokens may complete the stop string."""
    for k in range(min(len(stop) - 1, len(text)), 0, -1):
        if text.endswith(stop[:k]):
            return k
    return 0


def end_of_text(tokenizer):
    """The tokens that end a sample by default: the tokenizer's end of text, if it has one."""
    return [] if tokenizer.eot_id is None else [tokenizer.eot_id]


def turn_marker(token, base_vocab_size):
    """The text of an id past the tokenizer's vocabulary: a chat model's turn or tool token as
    its marker (<|end|>, <|call|>, docs/chat.md), written out when sampling without --chat
    and, for the tool tokens, in a reply."""
    i = token - base_vocab_size
    return CHAT_TOKENS[i] if i < len(CHAT_TOKENS) else f"<|id {token}|>"


class TextStream:
    """One sample's text, built token by token.

    BPE may split one character's UTF-8 bytes across tokens; decoding them alone
    prints U+FFFD, so tokens wait in `pending` until they decode to whole
    characters. The text ends before the first occurrence of `stop` (a string, or a
    list of them: the earliest found), or at one of `stop_tokens` (default: the
    tokenizer's end of text, if it has one)."""

    def __init__(self, tokenizer, stop=None, stop_tokens=None):
        self.tokenizer = tokenizer
        self.stops = [stop] if isinstance(stop, str) else list(stop or [])
        self.stop_tokens = set(end_of_text(tokenizer) if stop_tokens is None else stop_tokens)
        self.pending = []  # tokens not yet turned into text
        self.text = ""
        self.shown = 0  # how much of text take_new() has handed out
        self.stopped = False  # the stop string was found
        self.closed = False  # no more tokens will come

    def push(self, token):
        if self.stopped:
            return
        if token in self.stop_tokens:  # a BPE model ended its document, a chat model its turn
            self.close()
            self.stopped = True
            return
        if token >= self.tokenizer.vocab_size:  # a chat model's turn token, past its tokenizer's ids
            self._flush()
            if not self.stopped:  # the text before it may have held the stop string
                self._append(turn_marker(token, self.tokenizer.vocab_size))
            return
        self.pending.append(token)
        piece = self.tokenizer.decode(self.pending)
        if piece.endswith(REPLACEMENT) and len(self.pending) < MAX_PENDING:
            return  # maybe half a character: wait for the next token
        self.pending = []
        self._append(piece)

    def _append(self, piece):
        before = len(self.text)
        self.text += piece
        found = [f for stop in self.stops
                 if (f := self.text.find(stop, max(0, before - len(stop) + 1))) >= 0]
        if found:
            self.text, self.stopped = self.text[:min(found)], True

    def _flush(self):
        if self.pending and not self.stopped:
            self._append(self.tokenizer.decode(self.pending))
        self.pending = []

    def close(self):
        self._flush()
        self.closed = True

    def take_new(self):
        """The text not handed out yet, minus a tail that may begin the stop string."""
        end = len(self.text)
        if self.stops and not (self.stopped or self.closed):
            end -= max(held_back(self.text, stop) for stop in self.stops)
        new, self.shown = self.text[self.shown:end], max(self.shown, end)
        return new


@torch.inference_mode()  # as no_grad, and no version counters: less work per small op
def generate_stream(
    model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, min_p=None,
    repetition_penalty=1.0, stop_tokens=None, generator=None, use_cache=True, shift_context=False, decoder=None,
):
    """Yield the next token of every row, a (B,) LongTensor, max_new_tokens times.

    With use_cache, keys and values of past tokens are kept, so each step runs the
    model on one token. Past block_size the context is cropped to the last block_size
    tokens, as recomputation does: then every kept token moves one position and its
    keys in every layer after the first change (they attended to the dropped token),
    so the cache cannot be slid and each step recomputes the window; the tokens are
    exactly those of use_cache=False. shift_context=True instead keeps the last
    block_size // 2 tokens, rebuilds the cache once and goes on caching (llama.cpp's
    "context shift"): much faster past block_size, but tokens then see between half
    and all of block_size, so they differ from recomputation.
    A row that emits one of stop_tokens is finished: later steps repeat that stop
    token for it, and the generator stops once every row is finished.
    `decoder` (gptkit.fast.compiled_decode.CompiledDecoder, sample.py --compile) runs the
    cached steps instead of the model, with a cache of its own making.
    Dropout stays active in train mode: call model.eval() first.
    """
    check_sampling_options(temperature, top_k, top_p, min_p, repetition_penalty)
    if idx.dim() != 2 or idx.size(1) == 0:
        raise ValueError(f"idx must be (B, T) with T >= 1, got shape {tuple(idx.shape)}")
    B, T0 = idx.shape
    block = model.config.block_size
    seq = idx.new_empty(B, T0 + max_new_tokens)  # every token so far, preallocated
    seq[:, :T0] = idx
    n = T0
    stops = torch.tensor(sorted(set(stop_tokens or ())), dtype=torch.long, device=idx.device)
    use_cache = use_cache and cache_differs(model) is None  # an edit whose cache is wrong: recompute
    finished = torch.zeros(B, dtype=torch.bool, device=idx.device)
    stop_value = torch.zeros(B, dtype=torch.long, device=idx.device)
    cache = None
    cached = decoder or model.next_token_logits
    new_cache = decoder.new_cache if decoder else lambda: KVCache(model.config.n_layer, block)
    for _ in range(max_new_tokens):
        if not use_cache:  # nanoGPT's way: the whole (cropped) context every token
            logits = model.next_token_logits(seq[:, max(0, n - block) : n])
        elif cache is not None and cache.length < block:  # one new token
            logits = cached(seq[:, n - 1 : n], cache)
        elif cache is None or shift_context:  # (re)build the cache from a prompt or a shifted window
            keep = block if cache is None else max(1, block // 2)
            cache = new_cache()
            logits = cached(seq[:, max(0, n - keep) : n], cache)
        else:  # window full: it slides every token from now on, nothing can be reused
            logits = model.next_token_logits(seq[:, n - block : n])
        token = choose_next_token(
            logits, temperature, top_k, top_p, min_p, repetition_penalty,
            previous_tokens=seq[:, :n], generator=generator,
        )  # (B,)
        if stops.numel():
            token = torch.where(finished, stop_value, token)
            newly = torch.isin(token, stops) & ~finished
            stop_value = torch.where(newly, token, stop_value)
            finished |= newly
        seq[:, n] = token
        n += 1
        yield token
        if stops.numel() and bool(finished.all()):
            return


def fast_weights(dtype, device, cpu_decode=True, compile=False):
    """Which of gptkit/fast/cpu_linears.py's parts go into the model, or None: on a CPU, unless
    --compile or --cpu_decode false: float16 or int8 copies of the matrices as --dtype
    says, else NumPy's float32 product on the same weights."""
    if device.type != "cpu" or compile or not cpu_decode or dtype == "bfloat16":
        return None  # bfloat16: the model is cast, weights and arithmetic
    return dtype if dtype in ("float16", "int8") else "float32"


def say(line):
    print(line, file=sys.stderr)


def prepare_for_generating(model, dtype, device, cpu_decode=True, compile=False, note=say):
    """Cast `model` to `dtype` (--dtype) on `device` and, on a CPU, swap gptkit/fast/cpu_linears.py's
    faster products into it (once: a model already prepared is left as it is), unless
    --cpu_decode false or --compile. Returns the header line naming what runs each new token."""
    cast = inference_dtype(dtype, device)  # int8 off a CPU: refused
    weights = fast_weights(dtype, device, cpu_decode, compile)
    if dtype == "int8" and weights is None:
        raise UserError("--dtype int8 is gptkit/fast/cpu_linears.py's Int8Linear: leave out "
                        "--cpu_decode false and --compile")
    model.to(device=device, dtype=torch.float32 if weights else cast)
    if compile:
        return "decode: model.py's forward through torch.compile (gptkit/fast/compiled_decode.py)"
    if weights is None:
        return "decode: model.py's forward with its KV cache"
    if getattr(model, "swapped_linears", None) is None:
        model.swapped_linears = swap_in(model, weights, note)
    parts = model.swapped_linears
    if not parts:
        return "decode: model.py's forward with its KV cache (no nn.Linear swapped)"
    part = getattr(parts[0][1], parts[0][2])
    products = f"; int8 products: {part.product}" if isinstance(part, cpu_linears.Int8Linear) else ""
    return (f"decode: model.py's forward with its KV cache; {len(parts)} nn.Linear replaced by "
            f"{type(part).__name__} (gptkit/fast/cpu_linears.py, each checked against the module it replaces; "
            f"--cpu_decode false keeps nn.Linear){products}")


def swap_in(model, weights, note):
    """cpu_linears.swap_linears, then one cached step of model.py's forward both ways: if
    the swapped model fails there (model.py edited to read a Linear as the parts do not
    allow) or, in float32, its logits differ, the nn.Linear modules go back, one line says so."""
    missing = cpu_linears.available(weights)
    if missing:
        note(f"decode: this PyTorch has no {missing} for --dtype {weights}: model.py's float32 "
             "products run instead")
        weights = "float32"
    length = min(3, model.config.block_size)  # a prompt, then one cached token
    if length < 2:  # a context of one token: no cached step to check
        return cpu_linears.swap_linears(model, weights, note)
    probe = torch.arange(length, device="cpu")[None, :] % model.config.vocab_size  # (1, length)
    expected = cached_logits(model, probe)
    swapped = cpu_linears.swap_linears(model, weights, note)
    try:
        got = cached_logits(model, probe)
        gap = (got - expected).abs().max().item() / max(1.0, expected.abs().max().item())
        if weights == "float32" and not gap <= cpu_linears.TOLERANCE["float32"] * 10:
            raise ValueError(f"its logits differ from nn.Linear's by {gap:.3g}")
    except Exception as e:  # whatever the edit: model.py's own modules run instead
        cpu_linears.restore_linears(swapped)
        note(f"decode: gptkit/fast/cpu_linears.py's parts put back to nn.Linear ({first_line(e)}): "
             "model.py runs as written")
        return []
    return swapped


def cache_differs(model, note=say):
    """Why model.py's forward through a KVCache does not give the logits of its forward
    over the whole context, or None; found once per model, `note` told in one line. A
    learner's attention that ignores the cache (k, v = the new tokens' only) still trains
    and samples: every token then recomputes its context, as --use_cache false does."""
    if "cache_differs" not in model.__dict__:
        with cpu_linears.as_written(model):  # model.py's forward, not the parts' rounding
            why = None if model.config.block_size < 2 else cache_check(model)  # one position: nothing cached
        model.__dict__["cache_differs"] = why
        if why and note is not None:
            note(f"decode: model.py's forward through its KV cache is not its forward over the whole context "
                 f"({why}): each token recomputes its context, as --use_cache false")
    return model.__dict__["cache_differs"]


def cache_check(model):
    """cache_differs' probe: a prompt of 3 tokens and one more through a KVCache against
    the forward over all of them, in evaluation mode (dropout would make them differ)."""
    probe = torch.arange(1, min(4, model.config.block_size) + 1, device=next(model.parameters()).device)
    probe = probe[None, :] % model.config.vocab_size  # (1, T)
    training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            whole = torch.cat((model.next_token_logits(probe[:, :-1]), model.next_token_logits(probe)))
            cached = cached_logits(model, probe)
    except Exception as e:  # the cached path fails: recomputing still runs model.py's forward
        return f"{type(e).__name__}: {first_line(e)}"
    finally:
        model.train(training)
    gap = ((whole.float() - cached.float()).abs().max() / whole.float().abs().max().clamp_min(1.0)).item()
    return None if gap <= same_logits_tolerance(model) else f"its logits differ by {gap:.2g}"  # NaN differs too


def same_logits_tolerance(model):
    """How far apart (over the largest logit) two ways of computing the same logits may be:
    float32 rounds differently in the last bits when a product's rows or order change;
    16-bit weights or activations (a GPU's bfloat16, autocast) round each to ~3 digits."""
    weight = next(model.parameters())
    sixteen_bit = weight.dtype != torch.float32 or torch.is_autocast_enabled(weight.device.type)
    return 3e-2 if sixteen_bit else 1e-3


@torch.inference_mode()
def cached_logits(model, probe):
    """Logits after a prompt and after one more token through a KV cache, (2, vocab_size)."""
    cache = KVCache(model.config.n_layer, model.config.block_size)
    first = model.next_token_logits(probe[:, :-1], cache)
    return torch.cat((first, model.next_token_logits(probe[:, -1:], cache)))


def make_decoder(model, cfg, batch_size=None):
    """What runs each cached step: the compiled step for --compile, else None (model.py's
    forward, with the parts prepare_for_generating swapped in)."""
    if cfg.compile:
        return CompiledDecoder(model, batch_size or cfg.num_samples)
    return None


def generate_samples(model, tokenizer, prompt_ids, cfg, device, on_text=None, stop_tokens=None, decoder=None,
                     info=None):
    """Generate cfg.num_samples continuations of `prompt_ids` together as one batch.

    Returns the text of each sample (without the prompt), cut before cfg.stop.
    `on_text(piece)` is called with sample 1's new text as it is generated. A sample
    ends at one of `stop_tokens` (default: the tokenizer's end of text, if it has one),
    which is not part of its text. `decoder` is one made before (a server keeps one
    for every request), else one is made here as cfg says. A dict `info` is given
    sample 1's "new_tokens" (its stop token included) and "stopped" (it ended at a
    stop token or cfg.stop, not at max_new_tokens)."""
    if stop_tokens is None:
        stop_tokens = end_of_text(tokenizer)
    generator = torch.Generator(device=device)
    generator.manual_seed(cfg.seed)
    idx = torch.tensor([prompt_ids] * cfg.num_samples, dtype=torch.long, device=device)  # (B, T)
    streams = [TextStream(tokenizer, cfg.stop, stop_tokens) for _ in range(cfg.num_samples)]
    if decoder is None:
        decoder = make_decoder(model, cfg)
    with torch.no_grad():
        steps = generate_stream(
            model, idx, cfg.max_new_tokens, temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
            min_p=cfg.min_p, repetition_penalty=cfg.repetition_penalty, generator=generator,
            use_cache=cfg.use_cache, shift_context=cfg.shift_context, decoder=decoder,
            stop_tokens=stop_tokens or None,
        )
        new_tokens = 0
        try:
            for tokens in steps:  # (B,) the next token of every sample
                new_tokens += not streams[0].stopped
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
    if info is not None:
        info.update(new_tokens=new_tokens, stopped=streams[0].stopped)
    if on_text is not None:
        on_text(streams[0].take_new())
    return [s.text for s in streams]
