"""Generate text from a trained checkpoint (or from pretrained GPT-2), streamed as it comes.

    python sample.py --start "ROMEO:"     # the quick start's model, out-shakespeare/
    python sample.py --start=FILE:prompt.txt --num_samples 3 --max_new_tokens 200
    python sample.py --temperature 0 --max_new_tokens 100   # greedy: always the most likely token
    python sample.py --top_p 0.9 --stop "\\n\\n" --seed 7
    python sample.py --init_from gpt2 --start "The meaning of life is"
    python sample.py --ckpt ../nanoGPT/out-shakespeare-char/ckpt.pt \\
        --meta ../nanoGPT/data/shakespeare_char/meta.pkl           # a nanoGPT checkpoint
    # draw every head's attention, no sampling
    python sample.py --attention attn.png --layer 1 --start "ROMEO:"
    # talk to a chat-trained model
    python sample.py --out_dir out-chat --chat --system "Answer briefly."

Which model: `--ckpt FILE`, else `--out_dir` (default out-shakespeare, where
`python train.py configs/shakespeare.py` writes), taking best.pt there, else
ckpt.pt. The file loaded is named on stderr; stdout holds only the samples.
Checkpoints load with weights_only=True: a file holding pickled code is refused.
nanoGPT's ckpt.pt loads too (gptkit/interop/nanogpt.py).

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
tokens). `--shift_context false` gives exactly nanoGPT's tokens. On a CPU the
model's nn.Linear modules are swapped, once, for faster products on the same
weights (gptkit/fast/cpu_linears.py: NumPy's float32, or float16 or int8 copies with
--dtype), each checked against the module it replaces; model.py's forward runs
as written around them, so an edit to it always runs. The header on stderr
names what was swapped; `--cpu_decode false` keeps nn.Linear.

`--compile` compiles the one-token step once, gpt-fast's way (a cache allocated
for block_size positions, the position as a tensor: gptkit/fast/compiled_decode.py);
the prompt runs eagerly. In float32 its tokens are the eager cache's (tested). On
CUDA, where a one-token step is mostly kernel launches, it is the main lever for few samples;
on a CPU it does not pay: measured 2.1x the tokens/s for the quick-start model
(1.04x for the bigger baby GPT, bound by memory bandwidth) after 12 to 45 s of
compiling, which a default run (10 x 500 tokens, about a second) never earns back
(BENCHMARKS.md).
"""

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

from gptkit.ops.errors import quiet_start

quiet_start()  # a Ctrl-C or a missing package while the imports below load: one line, no traceback
import torch

from gptkit.generation import chat_session
from gptkit.config import parse_settings, setting
from gptkit.ops.device import SAMPLE_DTYPES, resolve_device
from gptkit.ops.errors import UserError, run_main
from gptkit.generation.generate import generate_samples, prepare_for_generating
from gptkit.models.loading import load_model
from gptkit.ops.paths import claim_output
from gptkit.generation.sampling import check_sampling_options


SEPARATOR = "-" * 15  # printed after every sample, as nanoGPT does
# One batch holds every sample's ids (and a cache per sample): keep its size sane.
MAX_SAMPLES = 4096
MAX_NEW_TOKENS = 1_000_000
MAX_TOTAL_TOKENS = 50_000_000
ESCAPES = {"\\n": "\n", "\\t": "\t", "\\\\": "\\"}


@dataclass
class SampleConfig:
    """Sampling"""

    init_from: str = setting(
        "resume", "resume (a checkpoint in out_dir or --ckpt), gpt2, gpt2-medium, gpt2-large, "
        "gpt2-xl, or a Hugging Face folder")
    out_dir: str = setting(
        "out-shakespeare", "folder holding best.pt / ckpt.pt (train.py's out_dir)")
    ckpt: str | None = setting(None, "a checkpoint file to load instead of looking in out_dir")
    start: str = setting("\n", "the prompt, or FILE:path to read it from a file")
    num_samples: int = setting(10, "samples to generate, together as one batch")
    max_new_tokens: int = setting(500, "tokens to generate per sample")
    temperature: float = setting(
        0.8, "1.0 samples the model's distribution; lower is more conservative; 0 is greedy")
    top_k: int | None = setting(
        200, "sample only among the k most likely tokens (0 or none: no limit)")
    top_p: float | None = setting(
        None, "nucleus sampling: the smallest set of tokens with this much probability")
    min_p: float | None = setting(
        None, "drop tokens less likely than min_p times the most likely one")
    repetition_penalty: float = setting(
        1.0, "above 1 makes tokens already present less likely (CTRL)")
    stop: str | None = setting(None, "end a sample before the first occurrence of this string")
    seed: int = setting(1337, "random seed: the same seed gives the same text")
    device: str = setting("auto", "auto (cuda, else mps, else cpu), cpu, cuda, cuda:1, mps")
    dtype: str = setting(
        "auto", "weights' dtype: auto (bfloat16 on CUDA when supported, else float32), "
        "float32, bfloat16, float16 (on a CPU: float16 copies of the matrices, half the bytes "
        "per token: BENCHMARKS.md), int8 (a CPU only: the matrices rounded to int8 per row, "
        "bfloat16 inputs; its speed and loss cost in BENCHMARKS.md)")
    compile: bool = setting(
        False, "compile the one-token decoding step once (a static cache; "
        "gptkit/fast/compiled_decode.py): the main speed lever on CUDA for few samples; on a "
        "CPU it does not pay (2x for the quick-start model after 12-45 s of compiling: "
        "BENCHMARKS.md)")
    cpu_decode: bool = setting(
        True, "on a CPU, swap faster products into model.py's nn.Linear modules "
        "(gptkit/fast/cpu_linears.py: NumPy's float32, or float16/int8 copies with --dtype; each "
        "checked against the module it replaces); false: nn.Linear as written")
    use_cache: bool = setting(
        True, "keep past keys/values (fast); false recomputes the whole context every token")
    shift_context: bool = setting(
        True, "past block_size, keep the last half of the context and go on caching (fast); "
        "false: as nanoGPT")
    data_dir: str = setting("data", "where to look for a nanoGPT checkpoint's <dataset>/meta.pkl")
    meta: str | None = setting(None, "a nanoGPT meta.pkl to take the character vocabulary from")
    chat: bool = setting(
        False, "talk to a chat-trained model: a reply to each line typed (or each line of a "
        "pipe), streamed until its end-of-turn token; Ctrl-D leaves "
        "(gptkit/generation/chat_session.py, docs/chat.md)")
    system: str | None = setting(
        None, "with --chat: the system message that opens the conversation")
    tools: str = setting(
        "calculator", "with --chat, a model trained on tool calls: what its calls run, calculator "
        "(its output forced into the reply) or none (the model writes on alone)")
    attention: str | None = setting(
        None, "draw every head's attention for the prompt into this PNG and exit")
    layer: int = setting(0, "which layer --attention draws")

    def __post_init__(self):
        if not 1 <= self.num_samples <= MAX_SAMPLES:
            raise ValueError(
                f"num_samples={self.num_samples} must be between 1 and {MAX_SAMPLES:,}")
        if not 0 <= self.max_new_tokens <= MAX_NEW_TOKENS:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} must be between 0 and "
                             f"{MAX_NEW_TOKENS:,}")
        if self.num_samples * self.max_new_tokens > MAX_TOTAL_TOKENS:
            raise ValueError(
                f"num_samples * max_new_tokens = {self.num_samples * self.max_new_tokens:,} "
                f"tokens in one batch: at most {MAX_TOTAL_TOKENS:,}; run several times with "
                "other --seed values instead"
            )
        if not 0 <= self.seed < 2**63:
            raise ValueError(f"seed={self.seed} must be between 0 and 2**63 - 1")
        if self.dtype not in ("auto", *SAMPLE_DTYPES):
            choices = ", ".join(SAMPLE_DTYPES)
            raise ValueError(f"dtype={self.dtype!r} must be one of auto, {choices}")
        if self.stop == "":
            raise ValueError("stop must not be empty (leave it out to generate max_new_tokens)")
        if self.compile and not self.use_cache:
            raise ValueError("compile=true compiles the cached one-token step: it needs "
                             "use_cache=true")
        check_sampling_options(self.temperature, self.top_k, self.top_p, self.min_p,
                               self.repetition_penalty)
        prompt_settings = self.start != "\n" or self.attention is not None or self.stop is not None
        if self.chat and prompt_settings:
            raise ValueError("chat=true takes the messages from the terminal or standard input: "
                             "leave out start, stop and attention (system sets a system message)")
        if self.system is not None and not self.chat:
            raise ValueError("system goes with chat=true")
        if self.tools not in chat_session.TOOL_CHOICES:
            choices = ", ".join(chat_session.TOOL_CHOICES)
            raise ValueError(f"tools={self.tools!r} must be one of {choices}")


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
            raise UserError("the prompt is empty: give some text with --start (e.g. --start "
                            "'ROMEO:')")
        ids = [tokenizer.eot_id]
    return ids


def write(piece):
    if piece:
        sys.stdout.write(piece)
        sys.stdout.flush()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    # a switch: --chat alone means true
    argv = ["--chat=true" if a == "--chat" else a for a in argv]
    (cfg,) = parse_settings(argv, [SampleConfig], prog="sample.py", description=__doc__)
    if cfg.stop is not None:
        cfg = dataclasses.replace(cfg, stop=unescape(cfg.stop))
    device = resolve_device(cfg.device)
    # before the model loads: a picture that cannot be written fails now
    if cfg.attention is not None:
        picture = claim_output(cfg.attention, "file", overwrite=True, what="--attention")
        cfg = dataclasses.replace(cfg, attention=str(picture))
    prompt = read_prompt(cfg.start)
    torch.manual_seed(cfg.seed)
    model, tokenizer, summary = load_model(cfg.init_from, cfg.out_dir, cfg.ckpt, cfg.data_dir,
                                           cfg.meta)
    if cfg.chat:  # a conversation instead of samples
        system = unescape(cfg.system) if cfg.system else None
        session = chat_session.Session(model, tokenizer, system, tools=cfg.tools)
        path = prepare_for_generating(model, cfg.dtype, device, cfg.cpu_decode, cfg.compile)
        if sys.stdin.isatty():  # from a pipe, stderr carries only a mistake's one line
            print(f"{summary}\n{path}", file=sys.stderr)
        return chat_session.talk(session, cfg, device, sys.stdin, write)
    # before any heavy work: unknown characters fail here
    prompt_ids = encode_prompt(tokenizer, prompt)
    if cfg.attention is not None and not 0 <= cfg.layer < model.config.n_layer:
        raise UserError(f"--layer {cfg.layer} does not exist: this model has layers 0 to "
                        f"{model.config.n_layer - 1}")
    # after the checks: a mistake's error is the only line printed
    path = prepare_for_generating(model, cfg.dtype, device, cfg.cpu_decode, cfg.compile)
    print(f"{summary}\n{path}", file=sys.stderr)

    if cfg.attention is not None:
        from gptkit.evals.attention_plot import draw_attention

        path = draw_attention(model, tokenizer, prompt, cfg.layer, cfg.attention)
        print(f"wrote {path}", file=sys.stderr)
        return 0

    write(prompt)
    texts = generate_samples(model, tokenizer, prompt_ids, cfg, device, on_text=write)
    write(f"\n{SEPARATOR}\n")
    for text in texts[1:]:
        write(f"{prompt}{text}\n{SEPARATOR}\n")
    return 0


if __name__ == "__main__":
    run_main(main)
