"""prepare.py against the simple way, on a generated corpus of a few hundred MB.

    python bench.py prepare                  # 200 MB corpus, GPT-2 BPE and char-level
    python bench.py prepare --size_mb 20     # a quick smoke run
    python bench.py prepare --tokenizers "" --parquet_mb 50   # only Parquet vs .txt, 50 then 100 MB

The second table prepares the same documents as .parquet (one row each, a `text`
column, as the web corpora are published) and as a folder of .txt files (one file
each), at --parquet_mb and at twice that: tokens/s, and a peak memory that should
not grow with the corpus.

The simple way is nanoGPT's: read the whole file, encode it in one call in one
process (tiktoken's encode_ordinary, or a dict lookup per character), and write
np.array(ids) to a bin. Each approach runs in a fresh subprocess so that peak
memory is its own: the larger of the process's VmHWM (the kernel's high-water
mark of resident memory) and the summed RSS of it and its worker processes,
sampled every 20 ms. Targets on a 2-core machine: GPT-2 BPE at least 1.7x the
simple way's tokens/s, at a quarter of its peak memory or less.
"""

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gptkit.prepare.shakespeare import shakespeare_input

REPO = Path(__file__).resolve().parent.parent


def shakespeare():
    """Tiny Shakespeare's local copy: $TINYSHAKESPEARE, else downloaded as prepare.py does."""
    return shakespeare_input(REPO / "data" / "shakespeare_char", None)


def add_arguments(parser):
    parser.add_argument("--size_mb", type=int, default=200, help="generated corpus size in MB (default 200)")
    parser.add_argument("--workers", type=int, default=None, help="prepare.py's processes (default: all cores)")
    parser.add_argument("--tokenizers", default="gpt2,char", help="comma-separated: gpt2, char")
    parser.add_argument("--parquet_mb", type=int, default=50,
                        help="Parquet vs .txt at this size and twice it, GPT-2 BPE (0: skip; default 50)")


def make_corpus(path, size_bytes, seed=0):
    """Tiny Shakespeare's lines in a seeded shuffled order, repeated until size_bytes: BPE
    sees realistic English, while no line order repeats the whole file verbatim."""
    lines = shakespeare().read_text(encoding="utf-8").splitlines(keepends=True)
    rng = random.Random(seed)
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < size_bytes:
            rng.shuffle(lines)
            block = "".join(lines)[: size_bytes - written]
            f.write(block)
            written += len(block.encode("utf-8"))


def make_documents(folder, size_bytes, seed=0):
    """The corpus as documents of 1-8 KB (web pages' sizes), written twice: docs.parquet
    (a `text` column, row groups of 1,024 rows) and txt/ (one .txt file per document, in
    the same sorted order). Returns (parquet path, txt folder)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = Path(folder)
    make_corpus(folder / "all.txt", size_bytes, seed)
    text = (folder / "all.txt").read_text(encoding="utf-8")
    (folder / "all.txt").unlink()
    rng = random.Random(seed)
    docs, start = [], 0
    while start < len(text):
        end = min(len(text), start + rng.randint(1000, 8000))
        docs.append(text[start:end])
        start = end
    (folder / "txt").mkdir()
    for i, doc in enumerate(docs):
        (folder / "txt" / f"{i:07d}.txt").write_text(doc, encoding="utf-8")
    pq.write_table(pa.table({"text": docs}), folder / "docs.parquet", row_group_size=1024)
    return folder / "docs.parquet", folder / "txt"


def vm_hwm_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def child_simple(corpus, tokenizer, out):
    """The simple way, in this (fresh) process. Prints a JSON line."""
    import numpy as np

    t0 = time.perf_counter()
    with open(corpus, encoding="utf-8") as f:
        text = f.read()
    if tokenizer == "gpt2":
        from gptkit.data.tokenizer import load_gpt2_encoding

        ids = load_gpt2_encoding().encode_ordinary(text)
    else:
        stoi = {ch: i for i, ch in enumerate(sorted(set(text)))}
        ids = [stoi[ch] for ch in text]
    np.array(ids, dtype=np.uint16).tofile(out)
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "tokens": len(ids), "peak_kib": vm_hwm_kib(), "cpu": cpu_seconds()}))


def child_prepare(corpus, tokenizer, out_dir, workers):
    """prepare.py's way, in this (fresh) process. Prints a JSON line."""
    from gptkit.prepare import build

    t0 = time.perf_counter()
    folder = build.prepare_dataset([corpus], tokenizer, "bench", out_dir, workers=workers, progress=False)
    seconds = time.perf_counter() - t0
    meta = json.loads((folder / "meta.json").read_text())
    n_workers = build.default_workers() if workers is None else workers
    print(
        json.dumps(
            {
                "seconds": seconds,
                "tokens": sum(meta["num_tokens"].values()),
                "peak_kib": vm_hwm_kib(),
                "workers": n_workers,
                "cpu": cpu_seconds(),
            }
        )
    )


def child_corpus(copy, out_dir, workers):
    """prepare.py fineweb_edu from a local copy (gptkit/prepare/shards.py's file-by-file path)."""
    from gptkit.prepare import build
    from gptkit.prepare.corpora import prepare_corpus

    t0 = time.perf_counter()
    folder = prepare_corpus("fineweb_edu", out_dir, base=copy, workers=workers, progress=False)
    seconds = time.perf_counter() - t0
    meta = json.loads((Path(folder) / "meta.json").read_text())
    n_workers = build.default_workers() if workers is None else workers
    print(json.dumps({"seconds": seconds, "tokens": sum(meta["num_tokens"].values()), "peak_kib": vm_hwm_kib(),
                      "workers": n_workers, "cpu": cpu_seconds()}))


def tree_rss_kib(pid):
    """Resident memory of a process and all its descendants, from /proc (0 once it is gone)."""
    total = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            total = next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0)
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = [int(c) for c in f.read().split()]
    except (OSError, ValueError):
        return total
    return total + sum(tree_rss_kib(child) for child in children)


def run_child(call):
    """Run `call` in a fresh interpreter; its JSON result plus the peak of its process tree's
    summed RSS, sampled every 20 ms (worker processes included)."""
    code = f"import sys; sys.path.insert(0, {str(REPO)!r}); from benchmarks.bench_prepare import *; {call}"
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=subprocess.PIPE, text=True, cwd=REPO)
        tree_peak = 0
        while proc.poll() is None:
            tree_peak = max(tree_peak, tree_rss_kib(proc.pid))
            time.sleep(0.02)
        err = proc.stderr.read()
        out.seek(0)
        result = out.read()
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark child failed ({call}):\n{err[-2000:]}")
    record = json.loads(result.strip().splitlines()[-1])
    # VmHWM is exact for the main process; the sampled sum adds the workers
    record["peak_kib"] = max(tree_peak, record["peak_kib"])
    return record


def cpu_seconds():
    """CPU time of this process and its waited-for children: a measure that, unlike wall
    time, a busy shared machine barely disturbs."""
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def run(args):
    from benchmarks.report import Table  # imports torch: keep it out of the measured children

    size = args.size_mb * 1_000_000
    tokenizers = [t.strip() for t in args.tokenizers.split(",") if t.strip()]
    table = Table(
        f"prepare: {args.size_mb} MB generated corpus (Tiny Shakespeare lines, shuffled)",
        [
            "tokenizer",
            "approach",
            "tokens",
            "seconds",
            "tokens/s",
            "speed vs simple",
            "CPU s",
            "peak RSS MB",
            "memory vs simple",
        ],
        note="simple = read the whole file, one encode call in one process, np.array(ids).tofile. "
        "prepare.py = two streaming passes (validate + count, then tokenize) on a worker pool; its peak RSS "
        "is the summed RSS of all its processes (sampled every 20 ms) or the main process's VmHWM if larger. CPU s: "
        "user + system time of all its processes, including imports and worker start-up. "
        "Target: GPT-2 BPE >= 1.7x the simple speed at <= 0.25x its memory.",
    )
    with tempfile.TemporaryDirectory(prefix="bench_prepare_") as tmp:
        corpus = Path(tmp) / "corpus.txt"
        make_corpus(corpus, size)
        for tokenizer in tokenizers:
            simple = run_child(f"child_simple({str(corpus)!r}, {tokenizer!r}, {str(Path(tmp) / 'simple.bin')!r})")
            ours = run_child(f"child_prepare({str(corpus)!r}, {tokenizer!r}, {tmp!r}, {args.workers!r})")
            for name, r in (
                ("simple (one process, whole file)", simple),
                (f"prepare.py ({ours['workers']} workers)", ours),
            ):
                rate = r["tokens"] / r["seconds"]
                table.add_row(
                    tokenizer,
                    name,
                    r["tokens"],
                    r["seconds"],
                    rate,
                    f"{rate / (simple['tokens'] / simple['seconds']):.2f}x",
                    r["cpu"],
                    r["peak_kib"] / 1024,
                    f"{r['peak_kib'] / simple['peak_kib']:.2f}x",
                )
            if tokenizer == "gpt2" and ours["tokens"] != simple["tokens"]:
                # one document: prepare.py encodes train and val apart, so a cut may differ by a token or so
                table.note += f" GPT-2 token counts differ by {ours['tokens'] - simple['tokens']} (the train/val cut)."
    tables = [table] if tokenizers else []
    if args.parquet_mb > 0:
        tables.append(parquet_table(args))
    return tables


def parquet_table(args):
    """Parquet against the same documents as .txt files, at parquet_mb and twice that."""
    from benchmarks.report import Table

    table = Table(
        f"prepare: Parquet vs .txt, GPT-2 BPE, {args.parquet_mb} and {2 * args.parquet_mb} MB of documents",
        ["input", "MB of text", "tokens", "seconds", "tokens/s", "CPU s", "peak RSS MB"],
        note="The same documents (1-8 KB each, Tiny Shakespeare's lines shuffled) as one .parquet file "
        "(a text column, row groups of 1,024 rows) and as a folder of one .txt file per document; "
        "prepare.py --input ... --tokenizer gpt2 on each, and prepare.py fineweb_edu reading the .parquet "
        "as a local copy of its repository (file by file, resumable: its split is per file, so its val "
        "differs), each in a fresh process; peak RSS as above. Equal token counts "
        "show the same documents; a peak that stays flat when the corpus doubles shows bounded memory.",
    )
    for mb in (args.parquet_mb, 2 * args.parquet_mb):
        with tempfile.TemporaryDirectory(prefix="bench_parquet_") as tmp:
            parquet, txt = make_documents(tmp, mb * 1_000_000)
            copy = Path(tmp) / "copy"  # the same file as a local copy of FineWeb-Edu's repository
            (copy / "sample" / "10BT").mkdir(parents=True)
            os.link(parquet, copy / "sample" / "10BT" / "000_00000.parquet")
            for name, call in (
                (".parquet", f"child_prepare({str(parquet)!r}, 'gpt2', {tmp!r}, {args.workers!r})"),
                (".txt folder", f"child_prepare({str(txt)!r}, 'gpt2', {tmp!r}, {args.workers!r})"),
                ("fineweb_edu, local copy", f"child_corpus({str(copy)!r}, {tmp!r}, {args.workers!r})"),
            ):
                r = run_child(call)
                table.add_row(name, mb, r["tokens"], r["seconds"], r["tokens"] / r["seconds"], r["cpu"],
                              r["peak_kib"] / 1024)
    return table
