"""Which library trains and runs prepare.py's BPE: Hugging Face `tokenizers` or `rustbpe` + tiktoken.

    python bench.py tokenizer                         # 100 MB corpus, vocabulary 8,192, A B A B
    python bench.py tokenizer --size_mb 10 --repeats 1   # a quick smoke run

Both libraries get the same corpus, cut into the same ~1 MB strings at the
safe cuts prepare.py uses (gptkit.prepare.encode.gpt2_cut), and the same
pre-tokenizer (GPT-2's regex); rustbpe buffers as many strings as prepare.py
lets it. Training and encoding each run in a fresh
subprocess so that peak memory is its own, and the two libraries alternate
(A B A B) because the machine is shared. Encoding is one process, one core:
prepare.py runs that on each core of its worker pool.

The corpus is generated in a temporary folder and deleted afterwards: the
Python standard library's source files (code: many distinct pre-tokens) and
Tiny Shakespeare's lines in shuffled order (English), half each.
"""

import json
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.bench_prepare import cpu_seconds, run_child, shakespeare, vm_hwm_kib
from gptkit.data.tokenizer import EOT, GPT2_PATTERN  # light: no torch in the measured children

LIBRARIES = ("tokenizers", "rustbpe")


def add_arguments(parser):
    parser.add_argument("--size_mb", type=int, default=100, help="generated corpus size in MB (default 100)")
    parser.add_argument("--vocab_size", type=int, default=8192, help="vocabulary to train (default 8192)")
    parser.add_argument("--repeats", type=int, default=2, help="A B rounds (default 2: A B A B)")


def make_corpus(path, size_bytes, seed=0):
    """Half standard-library source (sorted file order), half shuffled Shakespeare lines."""
    import random

    half = size_bytes // 2
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        for source in sorted(Path(json.__file__).parent.parent.rglob("*.py")):
            if "site-packages" in source.parts:
                continue
            try:
                text = source.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            f.write(text)
            written += len(text.encode("utf-8"))
            if written >= half:
                break
        lines = shakespeare().read_text(encoding="utf-8").splitlines(keepends=True)
        rng = random.Random(seed)
        while written < size_bytes:
            rng.shuffle(lines)
            block = "".join(lines)[: size_bytes - written]
            f.write(block)
            written += len(block.encode("utf-8"))


def corpus_strings(corpus):
    """The corpus as ~1 MB strings cut where GPT-2's pre-tokenizer would split anyway."""
    from gptkit.prepare.encode import build_tasks, gpt2_cut
    from gptkit.prepare.sources import Source, text_pieces

    pieces = text_pieces(Source(Path(corpus), "text", str(corpus)), "strict")
    for task in build_tasks([("train", pieces, False)], gpt2_cut):
        for _, text, _ in task:
            yield text




def train_tokenizers(strings, vocab_size):
    """Hugging Face tokenizers: a byte-level BPE; its tokenizer.json text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - 1, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(strings, trainer=trainer)
    tok.add_special_tokens([EOT])
    return tok.to_str(), tok.get_vocab_size()


def train_rustbpe(strings, vocab_size):
    """rustbpe: its mergeable ranks (token bytes in merge order) as JSON, for tiktoken."""
    import base64

    import rustbpe

    from gptkit.prepare.bpe import train_buffer_strings

    tok = rustbpe.Tokenizer()
    tok.train_from_iterator(strings, vocab_size - 1, buffer_size=train_buffer_strings(), pattern=GPT2_PATTERN)
    ranks = sorted(tok.get_mergeable_ranks(), key=lambda pair: pair[1])
    text = json.dumps({"pattern": tok.get_pattern(), "ranks": [base64.b64encode(bytes(b)).decode() for b, _ in ranks]})
    return text, len(ranks) + 1


def load_encoder(library, text):
    """An object with .encode(str) -> ids and .decode(ids) -> str."""
    if library == "tokenizers":
        from tokenizers import Tokenizer

        tok = Tokenizer.from_str(text)
        return lambda s: tok.encode(s, add_special_tokens=False).ids, tok.decode
    import base64

    import tiktoken

    d = json.loads(text)
    ranks = {base64.b64decode(b): i for i, b in enumerate(d["ranks"])}
    enc = tiktoken.Encoding("bpe", pat_str=d["pattern"], mergeable_ranks=ranks, special_tokens={EOT: len(ranks)})
    return enc.encode_ordinary, enc.decode


def child_train(library, corpus, vocab_size, out):
    """Train `library` on the corpus in this fresh process; save its result to `out`. Prints JSON."""
    train = train_tokenizers if library == "tokenizers" else train_rustbpe
    t0 = time.perf_counter()
    text, vocab = train(corpus_strings(corpus), vocab_size)
    seconds = time.perf_counter() - t0
    Path(out).write_text(text, encoding="utf-8")
    print(json.dumps({"seconds": seconds, "cpu": cpu_seconds(), "peak_kib": vm_hwm_kib(), "vocab": vocab}))


def child_encode(library, corpus, tokenizer_file):
    """Encode the corpus with the trained tokenizer, one process, one core. Prints JSON."""
    import os

    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core, as in a prepare.py worker
    encode, decode = load_encoder(library, Path(tokenizer_file).read_text(encoding="utf-8"))
    strings = list(corpus_strings(corpus))  # read first: time only the encoding
    n_bytes = sum(len(s.encode("utf-8")) for s in strings)
    t0, c0 = time.perf_counter(), cpu_seconds()
    tokens = 0
    for s in strings:
        tokens += len(encode(s))
    seconds, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    exact = all(decode(encode(s)) == s for s in strings[:: max(1, len(strings) // 5)])
    print(json.dumps({"seconds": seconds, "cpu": cpu, "tokens": tokens, "bytes": n_bytes, "round_trip": exact, "peak_kib": vm_hwm_kib()}))


def run(args):
    from benchmarks.report import Table

    table = Table(
        f"tokenizer: training a {args.vocab_size:,}-token byte-level BPE on a {args.size_mb} MB corpus, then encoding it",
        ["library", "round", "vocab", "train s", "train CPU s", "train peak RSS MB", "encode s (1 core)", "encode tok/s", "bytes/token", "round trip"],
        note="Corpus: Python standard-library sources + shuffled Tiny Shakespeare lines, generated in /tmp. "
        "Training uses every core (both libraries are multi-threaded Rust); encoding is one process. "
        "rustbpe trains, tiktoken encodes with its ranks; tokenizers does both. Same strings, same GPT-2 "
        "pre-tokenizer regex. The machine is shared with other jobs: compare rows of the same round.",
    )
    with tempfile.TemporaryDirectory(prefix="bench_tokenizer_") as tmp:
        corpus = Path(tmp) / "corpus.txt"
        make_corpus(corpus, args.size_mb * 1_000_000)
        for round_ in range(1, args.repeats + 1):
            for library in LIBRARIES:
                out = Path(tmp) / f"{library}.json"
                trained = run_child(
                    f"from benchmarks.bench_tokenizer import child_train; "
                    f"child_train({library!r}, {str(corpus)!r}, {args.vocab_size}, {str(out)!r})"
                )
                encoded = run_child(
                    f"from benchmarks.bench_tokenizer import child_encode; "
                    f"child_encode({library!r}, {str(corpus)!r}, {str(out)!r})"
                )
                table.add_row(
                    library,
                    round_,
                    trained["vocab"],
                    trained["seconds"],
                    trained["cpu"],
                    trained["peak_kib"] / 1024,
                    encoded["seconds"],
                    encoded["tokens"] / encoded["seconds"],
                    f"{encoded['bytes'] / encoded['tokens']:.3f}",
                    "exact" if encoded["round_trip"] else "DIFFERS",
                )
                print(table.rows[-1], file=sys.stderr, flush=True)
    return [table]
