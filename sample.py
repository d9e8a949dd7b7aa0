"""Generate text from a trained checkpoint (or from pretrained GPT-2), streamed as it comes.

    python sample.py --start "ROMEO:"                     # the quick start's model, out-shakespeare/
    python sample.py --start=FILE:prompt.txt --num_samples 3 --max_new_tokens 200
    python sample.py --temperature 0 --max_new_tokens 100 # greedy: always the most likely token
    python sample.py --top_p 0.9 --stop "\\n\\n" --seed 7
    python sample.py --init_from gpt2 --start "The meaning of life is"
    python sample.py --ckpt ../nanoGPT/out-shakespeare-char/ckpt.pt --meta ../nanoGPT/data/shakespeare_char/meta.pkl
    python sample.py --attention attn.png --layer 1 --start "ROMEO:"   # draw every head's attention, no sampling

Which model: `--ckpt FILE`, else `--out_dir` (default out-shakespeare, where
`python train.py configs/shakespeare.py` writes), taking best.pt there, else
ckpt.pt. The file loaded is named on stderr; stdout holds only the samples.
Checkpoints load with weights_only=True: a file holding pickled code is refused.
nanoGPT's ckpt.pt loads too (nanogpt_compat.py).

Output: the tokenizer stored in the checkpoint encodes the prompt and decodes the
samples. All `num_samples` are generated together as one batch; sample 1 is
printed live as its tokens arrive, the others when the batch is done. Each sample
is the prompt followed by its text, then a line of 15 dashes. `--stop STRING`
ends each sample just before the first occurrence of STRING (the string itself is
not printed). In --start and --stop, \\n, \\t and \\\\ typed in the shell mean a
newline, a tab and a backslash. The same `--seed` gives the same text.

Speed: the key/value cache means each new token runs the model on that token
alone. Past block_size the context must be cropped; nanoGPT then recomputes the
whole window for every token, which the cache cannot shorten (every position
shifts). By default we instead keep the last half of the window once, rebuild
the cache from it and go on caching (`shift_context`): each token still sees
between block_size/2 and block_size tokens, as in training, and generation
stays fast (the quick-start model has block_size 64, its samples are 500
tokens). `--shift_context false` gives exactly nanoGPT's tokens.
"""

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from checkpoint import FORMAT_VERSION, load_checkpoint
from config import parse_settings, setting
from errors import UserError, run_main
from nanogpt_compat import (
    is_nanogpt_checkpoint,
    nanogpt_model_config,
    nanogpt_state_dict,
    nanogpt_tokenizer_dict,
    strip_wrapper_prefixes,
)
from sampling import check_sampling_options
from tokenizer import tokenizer_from_dict

GPT2_NAMES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")
CHECKPOINT_NAMES = ("best.pt", "ckpt.pt")  # best.pt first: the weights with the lowest val loss
SEPARATOR = "-" * 15  # printed after every sample, as nanoGPT does
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
REPLACEMENT = "\ufffd"  # what decoding prints for incomplete UTF-8
ESCAPES = {"\\n": "\n", "\\t": "\t", "\\\\": "\\"}
MAX_PENDING = 4  # a UTF-8 character is at most 4 bytes, and every BPE token holds at least one


@dataclass
class SampleConfig:
    """Sampling"""

    init_from: str = setting(
        "resume",
        "resume (a checkpoint in out_dir or --ckpt), gpt2, gpt2-medium, gpt2-large, gpt2-xl, or a Hugging Face folder",
    )
    out_dir: str = setting("out-shakespeare", "folder holding best.pt / ckpt.pt (train.py's out_dir)")
    ckpt: str | None = setting(None, "a checkpoint file to load instead of looking in out_dir")
    start: str = setting("\n", "the prompt, or FILE:path to read it from a file")
    num_samples: int = setting(10, "samples to generate, together as one batch")
    max_new_tokens: int = setting(500, "tokens to generate per sample")
    temperature: float = setting(0.8, "1.0 samples the model's distribution; lower is more conservative; 0 is greedy")
    top_k: int | None = setting(200, "sample only among the k most likely tokens (none: no limit)")
    top_p: float | None = setting(None, "nucleus sampling: the smallest set of tokens with this much probability")
    min_p: float | None = setting(None, "drop tokens less likely than min_p times the most likely one")
    repetition_penalty: float = setting(1.0, "above 1 makes tokens already present less likely (CTRL)")
    stop: str | None = setting(None, "end a sample before the first occurrence of this string")
    seed: int = setting(1337, "random seed: the same seed gives the same text")
    device: str = setting("auto", "auto (cuda, else mps, else cpu), cpu, cuda, cuda:1, mps")
    dtype: str = setting("auto", "weights' dtype: auto (bfloat16 on CUDA when supported, else float32), float32, bfloat16 (2x faster one-sample decoding on most CPUs), float16")
    compile: bool = setting(False, "torch.compile the model (slow to start; pays off only for long runs)")
    use_cache: bool = setting(True, "keep past keys/values (fast); false recomputes the whole context every token")
    shift_context: bool = setting(
        True, "past block_size, keep the last half of the context and go on caching (fast); false: as nanoGPT"
    )
    data_dir: str = setting("data", "where to look for a nanoGPT checkpoint's <dataset>/meta.pkl")
    meta: str | None = setting(None, "a nanoGPT meta.pkl to take the character vocabulary from")
    attention: str | None = setting(None, "draw every head's attention for the prompt into this PNG and exit")
    layer: int = setting(0, "which layer --attention draws")

    def __post_init__(self):
        if self.num_samples < 1:
            raise ValueError(f"num_samples={self.num_samples} must be at least 1")
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} must be >= 0")
        if self.dtype not in ("auto", *DTYPES):
            raise ValueError(f"dtype={self.dtype!r} must be one of auto, {', '.join(DTYPES)}")
        if self.stop == "":
            raise ValueError("stop must not be empty (leave it out to generate max_new_tokens)")
        check_sampling_options(self.temperature, self.top_k, self.top_p, self.min_p, self.repetition_penalty)


# ---- loading -------------------------------------------------------------------


def resolve_device(name):
    """'auto' -> the best device present; an explicit device must exist."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"unknown device {name!r}: use auto, cpu, cuda, cuda:N or mps")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device {name!r} asked for, but this PyTorch sees no CUDA GPU: use --device cpu")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UserError(f"device {name!r} asked for, but MPS is not available: use --device cpu")
    return device


def inference_dtype(dtype, device):
    """The dtype the weights are cast to. Generating needs no fp32 master copy, and
    one token at a time reads every weight once per step: half the bytes (bfloat16)
    is up to twice the speed where memory bandwidth is the limit, as on CPUs."""
    if dtype == "auto":
        bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        dtype = "bfloat16" if bf16 else "float32"
    return DTYPES[dtype]


def find_checkpoint(out_dir, ckpt=None):
    """The file to load: `ckpt` when given, else best.pt or ckpt.pt in `out_dir`."""
    if ckpt:
        return Path(ckpt)
    folder = Path(out_dir)
    for name in CHECKPOINT_NAMES:
        if (folder / name).is_file():
            return folder / name
    how = "train one first with python train.py configs/shakespeare.py, or pass --out_dir DIR or --ckpt FILE"
    if not folder.is_dir():
        raise UserError(f"no checkpoint: the folder {folder} does not exist; {how}")
    raise UserError(f"no checkpoint in {folder} (looked for {' and '.join(CHECKPOINT_NAMES)}); {how}")


def load_weights(model, state_dict, source):
    """Copy weights into `model`, explaining any mismatch instead of a traceback.
    Buffers the file lacks (e.g. a mask the model builds itself) keep the model's values."""
    target = model.state_dict()
    buffers = {name for name, _ in model.named_buffers()}
    missing = [k for k in target if k not in state_dict and k not in buffers]
    unexpected = [k for k in state_dict if k not in target]
    wrong_shape = [
        f"{k} {tuple(v.shape)} vs {tuple(target[k].shape)}"
        for k, v in state_dict.items()
        if k in target and (not torch.is_tensor(v) or v.shape != target[k].shape)
    ]
    if missing or unexpected or wrong_shape:
        parts = [
            f"{label} {', '.join(items[:4])}{' ...' if len(items) > 4 else ''}"
            for label, items in (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong_shape))
            if items
        ]
        raise UserError(f"the weights in {source} do not fit the model its config describes: {'; '.join(parts)}")
    model.load_state_dict(state_dict, strict=False)


def model_from_checkpoint(ckpt, source, data_dir="data", meta=None):
    """(GPT in eval mode, tokenizer, one-line summary) from a loaded checkpoint dict:
    ours (format_version, model_config, tokenizer) or nanoGPT's (model_args)."""
    from model import GPT, GPTConfig  # imported here so `sample.py --help` stays quick

    if not isinstance(ckpt, dict):
        raise UserError(f"{source} is not a checkpoint: it holds a {type(ckpt).__name__}, not a dict")
    if is_nanogpt_checkpoint(ckpt):
        tokenizer_dict, tokenizer_source = nanogpt_tokenizer_dict(ckpt, data_dir, meta)
        tokenizer = tokenizer_from_dict(tokenizer_dict)
        model_kwargs = nanogpt_model_config(ckpt, tokenizer.vocab_size)
        state = nanogpt_state_dict(ckpt)
        described = f"nanoGPT checkpoint, vocabulary from {tokenizer_source}"
        val_loss = ckpt.get("best_val_loss")
    elif all(k in ckpt for k in ("model", "model_config", "tokenizer")):
        version = ckpt.get("format_version", FORMAT_VERSION)
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise UserError(
                f"{source} has format_version {version!r}; this sample.py reads up to {FORMAT_VERSION}: update the code"
            )
        tokenizer = tokenizer_from_dict(ckpt["tokenizer"])
        model_kwargs = dict(ckpt["model_config"])
        state = strip_wrapper_prefixes(ckpt["model"])
        described = f"{ckpt['tokenizer'].get('type')} tokenizer"
        val_loss = ckpt.get("val_loss", ckpt.get("best_val_loss"))
    else:
        keys = ", ".join(sorted(map(str, ckpt))[:8]) or "none"
        raise UserError(f"{source} is not a checkpoint of this project or of nanoGPT (its keys: {keys})")

    model_kwargs["dropout"] = 0.0  # sampling never drops out
    try:
        config = GPTConfig(**model_kwargs)
    except TypeError as e:  # a field this model.py does not know
        raise UserError(
            f"{source}: its model_config does not fit this model.py ({e}); was it written by a newer version?"
        )
    except ValueError as e:
        raise UserError(f"{source}: {e}")
    if tokenizer.vocab_size > config.vocab_size:
        raise UserError(
            f"{source}: its tokenizer has {tokenizer.vocab_size} tokens but the model only {config.vocab_size}"
        )
    model = GPT(config)
    load_weights(model, state, source)
    model.eval()

    details = [described]
    if isinstance(ckpt.get("iter_num"), int):
        details.append(f"iteration {ckpt['iter_num']}")
    if val_loss is not None:
        details.append(f"val loss {float(val_loss):.4f}")
    return model, tokenizer, f"loaded {source} ({', '.join(details)})"


def load_model(cfg):
    """(GPT on the CPU in eval mode, tokenizer, summary) for cfg.init_from / out_dir / ckpt."""
    if cfg.init_from != "resume":
        if cfg.init_from not in GPT2_NAMES and not Path(cfg.init_from).is_dir():
            raise UserError(
                f"init_from={cfg.init_from!r} must be resume, one of {', '.join(GPT2_NAMES)}, "
                "or a folder in Hugging Face format (config.json and model.safetensors)"
            )
        from hf_gpt2 import load_gpt2

        model = load_gpt2(cfg.init_from)
        model.eval()
        return model, tokenizer_from_dict({"type": "gpt2"}), f"loaded pretrained {cfg.init_from} (GPT-2 BPE)"
    path = find_checkpoint(cfg.out_dir, cfg.ckpt)
    ckpt = load_checkpoint(path, map_location="cpu")  # UserError for a missing, damaged or unsafe file
    return model_from_checkpoint(ckpt, path, cfg.data_dir, cfg.meta)


def unescape(text):
    """Turn the two-character sequences \\n, \\t and \\\\ typed in a shell into a newline,
    a tab and a backslash (as llama.cpp does), so --stop "\\n\\n" means a blank line."""
    out, i = [], 0
    while i < len(text):
        pair = text[i : i + 2]
        if pair in ESCAPES:
            out.append(ESCAPES[pair])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def read_prompt(start):
    """The prompt text: `start` with escapes turned into characters, or the contents
    of the file after `FILE:` (taken as it is)."""
    if not start.startswith("FILE:"):
        return unescape(start)
    path = Path(start[len("FILE:"):])
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"prompt file {path} does not exist (from --start FILE:{path})")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"could not read prompt file {path}: {e}")


def encode_prompt(tokenizer, prompt):
    """Token ids of the prompt; an empty prompt starts BPE models at <|endoftext|>."""
    ids = tokenizer.encode(prompt)  # a character outside a char vocabulary raises UserError
    if not ids:
        if tokenizer.eot_id is None:
            raise UserError("the prompt is empty: give some text with --start (e.g. --start 'ROMEO:')")
        ids = [tokenizer.eot_id]
    return ids


# ---- generating ----------------------------------------------------------------


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


def write(piece):
    if piece:
        sys.stdout.write(piece)
        sys.stdout.flush()


def main(argv=None):
    (cfg,) = parse_settings(argv, [SampleConfig], prog="sample.py", description=__doc__)
    if cfg.stop is not None:
        cfg = dataclasses.replace(cfg, stop=unescape(cfg.stop))
    device = resolve_device(cfg.device)
    prompt = read_prompt(cfg.start)
    torch.manual_seed(cfg.seed)
    model, tokenizer, summary = load_model(cfg)
    print(summary, file=sys.stderr)
    prompt_ids = encode_prompt(tokenizer, prompt)  # before any heavy work: unknown characters fail here
    model.to(device=device, dtype=inference_dtype(cfg.dtype, device))

    if cfg.attention is not None:
        from attention_plot import draw_attention

        if not 0 <= cfg.layer < model.config.n_layer:
            last = model.config.n_layer - 1
            raise UserError(f"--layer {cfg.layer} does not exist: this model has layers 0 to {last}")
        path = draw_attention(model, tokenizer, prompt, cfg.layer, cfg.attention)
        print(f"wrote {path}", file=sys.stderr)
        return 0

    if cfg.compile:
        # Compile each block in place: generate_stream calls the blocks, not model.forward.
        for block in model.transformer.h:
            block.compile()

    write(prompt)
    texts = generate_samples(model, tokenizer, prompt_ids, cfg, device, on_text=write)
    write(f"\n{SEPARATOR}\n")
    for text in texts[1:]:
        write(f"{prompt}{text}\n{SEPARATOR}\n")
    return 0


if __name__ == "__main__":
    run_main(main)
