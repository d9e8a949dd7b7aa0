"""Build a dataset folder: data/NAME/{train.bin, val.bin, meta.json}.

The bins are raw little-endian token ids (uint16, or uint32 for vocabularies
over 65,536 ids), readable with `np.memmap(path, dtype=meta["dtype"])`.
meta.json holds the tokenizer, the token counts, each source's sha256 and the
split rule; it is renamed into place last, so a dataset folder without it is
incomplete and an interrupted run never leaves a dataset that looks valid.

The input streams through twice in bounded memory: a first pass validates it
and counts characters (and collects the character vocabulary), the second
tokenizes it on all cores and appends to the bins. With `--tokenizer bpe` a pass
in between trains the BPE on the training split (gptkit/prepare/bpe.py), and
tokenizer.json goes beside the bins. `prepare.py` is the command.

Before any of that, the dataset folder is claimed (gptkit/ops/paths.py: writable, a
name the system takes) and locked; a stream input (a pipe, `<(...)`, `-`) can be
read only once, so it is first copied into a temporary file there, which the
passes then read (and which is removed at the end, or by the next run if killed).
"""

import hashlib
import json
import contextlib
import os
import re
import secrets
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np

from gptkit.ops import faults
from gptkit.ops.atomic import fsync_dir, publish, terminate_by_exception
from gptkit.ops.errors import UserError
from gptkit.ops.lock import LOCK_NAME, FolderLock, remove_stale_temps
from gptkit.ops.paths import TEMP_MARK, claim_output
from gptkit.prepare.encode import CHUNK_CHARS, any_cut, build_tasks, dtype_for, encode_task, gpt2_cut, make_pool, ordered_map, stop_pool
from gptkit.prepare.shakespeare import shakespeare_input
from gptkit.prepare.sources import iter_documents, resolve_inputs, spool_streams
from gptkit.prepare.split import plan_split, scan_inputs
from gptkit.data.tokenizer import BPE_FILE, GPT2_EOT_ID, load_gpt2_encoding

FORMAT_VERSION = 1
TOKENIZERS = ("char", "gpt2", "bpe")
GPT2_VOCAB_SIZE = 50257

SHAKESPEARE_DATASETS = {"shakespeare_char": "char", "shakespeare": "gpt2"}
DOWNLOADED_CORPORA = {"openwebtext": "gpt2", "fineweb_edu": "gpt2"}  # gptkit/prepare/corpora.py
GENERATED_CHATS = {"arithmetic_chat": "char", "multiply_tools": "char", "multiply_plain": "char"}  # prepare/arithmetic.py
CONVERSATION_SETS = {"no_robots": "gpt2", "smoltalk": "gpt2"}  # gptkit/prepare/conversations.py
NAMED_DATASETS = {**SHAKESPEARE_DATASETS, **GENERATED_CHATS, "gsm8k_chat": "gpt2",  # gsm8k_chat: prepare/gsm8k.py
                  **DOWNLOADED_CORPORA, **CONVERSATION_SETS}


# ---------------------------------------------------------------- writing


def fingerprint(meta):
    keys = ("tokenizer", "num_tokens", "split")
    payload = {k: meta[k] for k in keys} | {"sources": [s["sha256"] for s in meta["sources"]]}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def write_synced(path, text):
    """Write `text` to the temporary `path` and flush it to the disk."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


DATASET_FILES = ("train.bin", "val.bin", "train_mask.bin", "val_mask.bin", BPE_FILE, "meta.json")  # every kind's


def commit_dataset(folder, tmp, names):
    """Publish the temporaries tmp[name] of a new dataset as folder/name. A dataset is
    complete only when meta.json exists, so the old one goes first: a kill -9 between
    the renames leaves files without meta.json (nothing that looks valid), never new
    files beside an old meta.json. Ctrl-C and SIGTERM wait for the last rename, so
    they leave the previous dataset whole or the new one complete. The files of
    another kind of dataset (an earlier BPE's tokenizer.json, a chat dataset's masks)
    are removed: nothing describes them any more."""
    with signals_held():
        (folder / "meta.json").unlink(missing_ok=True)
        for name in DATASET_FILES:
            if name not in names:
                (folder / name).unlink(missing_ok=True)
        fsync_dir(folder)
        faults.maybe_sigterm("sigterm_during_commit")  # test-only: a stop between the renames
        for name in names:
            publish(tmp[name], folder / name)  # replaces the previous dataset's file
        fsync_dir(folder)


@contextlib.contextmanager
def signals_held(signums=(signal.SIGINT, signal.SIGTERM)):
    """Hold Ctrl-C and SIGTERM back while the block runs; one that came meanwhile is
    delivered (to the handler there was before) as soon as it ends. Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending = []
    previous = {s: signal.signal(s, lambda signum, frame: pending.append(signum)) for s in signums}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)  # None: a handler set outside Python
        for s in dict.fromkeys(pending):
            signal.raise_signal(s)


def write_dataset(folder, make_segments, sources, errors, kind, scan, rule, pool, workers, chunk_chars, bar, bpe=None):
    """Pass 2: tokenize into temporary bins, then rename train.bin, val.bin (tokenizer.json)
    and meta.json into place. `bpe` is the BPETokenizer when kind is 'bpe'."""
    if kind == "bpe":
        vocab_size, eot_id = bpe.vocab_size, bpe.eot_id
    else:
        vocab_size = len(scan.chars) if kind == "char" else GPT2_VOCAB_SIZE
        eot_id = GPT2_EOT_ID if kind == "gpt2" else None
    dtype = dtype_for(vocab_size)
    itemsize = np.dtype(dtype).itemsize
    append_eot = eot_id is not None and scan.n_docs > 1
    find_cut = any_cut if kind == "char" else gpt2_cut  # the trained BPE pre-tokenizes as GPT-2 does
    stats = [(Path(s.path).stat().st_size, Path(s.path).stat().st_mtime_ns) for s in sources]

    tag = f"{TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"
    names = ("train.bin", "val.bin") + ((BPE_FILE,) if kind == "bpe" else ()) + ("meta.json",)
    tmp = {name: folder / f".{name}{tag}" for name in names}
    counts = {"train": 0, "val": 0}
    try:
        with open(tmp["train.bin"], "wb") as f_train, open(tmp["val.bin"], "wb") as f_val:
            docs = iter_documents(sources, errors, lambda i, block: bar.update(len(block)))
            segments = ((split, pieces, append_eot) for split, pieces in make_segments(docs))
            tasks = build_tasks(segments, find_cut, chunk_chars)
            t0, halfway = time.perf_counter(), scan.n_chars // 2
            done_chars = 0
            for train_bytes, val_bytes, n_chars in ordered_map(pool, encode_task, tasks, workers):
                f_train.write(train_bytes)
                f_val.write(val_bytes)
                counts["train"] += len(train_bytes) // itemsize
                counts["val"] += len(val_bytes) // itemsize
                done_chars += n_chars
                if done_chars >= halfway:
                    faults.maybe_exit("exit_during_prepare")  # test-only: die with the bins half written
                    faults.maybe_sigterm("sigterm_during_prepare")
                tokens = counts["train"] + counts["val"]
                bar.set_postfix_str(f"{tokens / max(time.perf_counter() - t0, 1e-9):,.0f} tok/s", refresh=False)
            for f in (f_train, f_val):
                f.flush()
                os.fsync(f.fileno())
        for source, stat in zip(sources, stats):
            path = Path(source.path)
            if (path.stat().st_size, path.stat().st_mtime_ns) != stat:
                raise UserError(f"input {source.shown} changed while it was being prepared: run again")
        assert counts["train"] > 0 and counts["val"] > 0, f"empty split after a non-empty plan: {counts}"

        tokenizer = {"type": "char", "chars": scan.chars} if kind == "char" else {"type": "gpt2"}
        if kind == "bpe":
            tokenizer = bpe.describe()  # the tokenizer itself goes in tokenizer.json, pinned by its sha256
            write_synced(tmp[BPE_FILE], bpe.to_json())
        meta = {
            "format_version": FORMAT_VERSION,
            "tokenizer": tokenizer,
            "vocab_size": vocab_size,
            "dtype": dtype,
            "eot_id": eot_id,
            "num_tokens": counts,
            "sources": scan.sources,
            "split": rule,
        }
        meta["fingerprint"] = fingerprint(meta)
        write_synced(tmp["meta.json"], meta_json(meta))
        commit_dataset(folder, tmp, names)
    finally:
        for path in tmp.values():
            path.unlink(missing_ok=True)
    return meta


def meta_json(meta):
    """One top-level key per line, each value compact: readable even with a huge vocabulary."""
    lines = [f"  {json.dumps(key)}: {json.dumps(value)}" for key, value in meta.items()]
    return "{\n" + ",\n".join(lines) + "\n}\n"


# ---------------------------------------------------------------- library entry points


def default_workers():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def progress_bar(enabled, total, desc):
    from tqdm import tqdm

    return tqdm(
        total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, disable=not enabled, file=sys.stderr
    )


def check_name(name):
    if not name or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", name):
        raise UserError(f"dataset name {name!r} must be a plain folder name (letters, digits, _ . -)")



@contextlib.contextmanager
def locked_dataset_folder(folder):
    """Hold the one-writer lock of a dataset folder (stale temporaries of a killed run
    removed) while the body writes it. If the body fails, the folders the lock created
    are removed again: a run that wrote nothing leaves no trace."""
    created = [p for p in (folder, *folder.parents) if not p.exists()]
    lock = FolderLock(folder, "prepare.py", "use another --name").acquire()
    restore = terminate_by_exception()  # SIGTERM then removes the temporaries as an error does
    try:
        remove_stale_temps(folder)
        yield
    except BaseException:
        if restore is not None:
            restore()
        lock.release()
        if created:
            (folder / LOCK_NAME).unlink(missing_ok=True)
            for made in created:
                if any(made.iterdir()):
                    break
                made.rmdir()
        raise
    if restore is not None:
        restore()
    lock.release()

def prepare_dataset(
    inputs,
    tokenizer,
    name,
    out_dir="data",
    val_fraction=0.1,
    errors="strict",
    workers=None,
    progress=True,
    *,
    vocab_size=None,
    tokenizer_from=None,
    chunk_chars=CHUNK_CHARS,
    text_column="text",
):
    """Tokenize `inputs` (paths: text files, .jsonl, .parquet, folders of .txt and .parquet) into
    out_dir/name; return the folder. `text_column` is the column read from Parquet files.

    tokenizer 'bpe' trains a BPE of `vocab_size` ids on the training split, or reuses
    the one at `tokenizer_from` (a dataset folder, out_dir, checkpoint or tokenizer.json)."""
    if tokenizer not in TOKENIZERS:
        raise UserError(f"unknown tokenizer {tokenizer!r}: choose one of {', '.join(TOKENIZERS)}")
    bpe = check_bpe_settings(tokenizer, vocab_size, tokenizer_from)  # the reused BPE, or None
    check_name(name)
    if not 0 < val_fraction < 1:
        raise UserError(f"--val_fraction must be between 0 and 1 (exclusive), got {val_fraction}")
    if errors not in ("strict", "replace"):
        raise UserError(f"--errors must be 'strict' or 'replace', got {errors!r}")
    workers = default_workers() if workers is None else max(1, int(workers))
    # The destination before any input is read: a folder that cannot be written fails now,
    # not after the scan and the BPE training.
    folder = claim_output(Path(out_dir) / name, "folder", overwrite=True, what="the dataset folder (--data_dir/--name)")
    sources = resolve_inputs([str(p) for p in inputs], text_column)
    if text_column != "text" and not any(s.kind == "parquet" for s in sources):
        raise UserError(f"--text_column {text_column} names a Parquet column, but no input is a .parquet file")
    shown = ", ".join(str(p) for p in inputs)
    if tokenizer == "gpt2":
        load_gpt2_encoding()  # here, in one process: offline without tiktoken's files is one clear line

    tag = f"{TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"
    pool, copies = None, []
    with locked_dataset_folder(folder):  # one writer per dataset folder
        try:
            # A pipe or standard input can be read once; the passes below read the input two or
            # three times, so such a stream is first copied (once) into the dataset folder.
            sources, copies = spool_streams(sources, folder, tag)
            total_bytes = sum(os.path.getsize(s.path) for s in sources)
            if total_bytes < 2 * chunk_chars:
                workers = 1  # starting processes would cost more than it saves
            init = ("gpt2", None, dtype_for(GPT2_VOCAB_SIZE), GPT2_EOT_ID)
            pool = None if tokenizer == "bpe" else make_pool(workers, ("charset",) if tokenizer == "char" else init)
            with progress_bar(progress, total_bytes, "scan") as bar:
                scan = scan_inputs(sources, errors, tokenizer == "char", pool, workers, bar)
            rule, make_segments = plan_split(scan, val_fraction, shown)
            if tokenizer == "bpe":
                if bpe is None:
                    bpe = train_on_train_split(sources, errors, make_segments, vocab_size, chunk_chars, progress, total_bytes)
                vocab_size = bpe.vocab_size
                pool = make_pool(workers, ("bpe", None, dtype_for(vocab_size), bpe.eot_id, bpe.to_json()))
            elif tokenizer == "char":  # the encoders need the vocabulary: start them afresh
                if pool is not None:
                    stop_pool(pool)
                vocab_size = len(scan.chars)
                pool = make_pool(workers, ("char", scan.chars, dtype_for(vocab_size), None))
            else:
                vocab_size = GPT2_VOCAB_SIZE
            with progress_bar(progress, total_bytes, "tokenize") as bar:
                meta = write_dataset(
                    folder, make_segments, sources, errors, tokenizer, scan, rule, pool, workers, chunk_chars, bar, bpe
                )
        finally:
            _clean_up(pool, copies)
    if progress:
        n = meta["num_tokens"]
        print(
            f"wrote {folder}: train {n['train']:,} tokens, val {n['val']:,} tokens "
            f"({meta['dtype']}, vocab {vocab_size:,})",
            file=sys.stderr,
        )
    return folder


def _clean_up(pool, copies):
    if pool is not None:
        stop_pool(pool)
    for copy in copies:
        copy.unlink(missing_ok=True)


def check_bpe_settings(tokenizer, vocab_size, tokenizer_from):
    """Check --vocab_size / --tokenizer_from before any text is read; the reused BPETokenizer or None."""
    from gptkit.prepare.bpe import check_vocab_size, tokenizer_from_path

    if tokenizer != "bpe":
        if vocab_size is not None or tokenizer_from is not None:
            raise UserError("--vocab_size and --tokenizer_from go with --tokenizer bpe")
        return None
    if (vocab_size is None) == (tokenizer_from is None):
        raise UserError(
            "--tokenizer bpe needs exactly one of --vocab_size N (train a new BPE on the training split) "
            "or --tokenizer_from PATH (reuse the BPE of a dataset folder or checkpoint)"
        )
    if vocab_size is not None:
        check_vocab_size(vocab_size)
        return None
    return tokenizer_from_path(tokenizer_from)


def train_on_train_split(sources, errors, make_segments, vocab_size, chunk_chars, progress, total_bytes):
    """The training pass: stream the train split (never val) into the BPE trainer."""
    from gptkit.prepare.bpe import train_bpe

    with progress_bar(progress, total_bytes, "train bpe") as bar:
        docs = iter_documents(sources, errors, lambda i, block: bar.update(len(block)))
        # val documents are skipped unread; a single document's val part is never reached
        train_only = ((split, pieces, False) for split, pieces in make_segments(docs) if split == "train")
        texts = (text for task in build_tasks(train_only, gpt2_cut, chunk_chars) for _, text, _ in task if text)
        return train_bpe(texts, vocab_size)


def check_dataset_name(name):
    if name not in NAMED_DATASETS:
        raise UserError(
            f"unknown dataset {name!r}: known datasets are {', '.join(NAMED_DATASETS)}; "
            "for your own text use --input PATH --tokenizer {char,gpt2,bpe} --name NAME"
        )


def prepare_named_dataset(name, out_dir="data", input_path=None, *, workers=None, progress=True):
    """Prepare Tiny Shakespeare (shakespeare_char, shakespeare) into out_dir/name; return the folder.
    Every named dataset, arithmetic_chat too: gptkit/prepare/named.py."""
    check_dataset_name(name)
    assert name in SHAKESPEARE_DATASETS, f"{name} is prepared by gptkit.prepare.named.prepare_named"
    folder = claim_output(Path(out_dir) / name, "folder", overwrite=True, what="the dataset folder (--data_dir)")
    path = shakespeare_input(folder, input_path)  # may download into the folder
    return prepare_dataset([path], NAMED_DATASETS[name], name, out_dir, workers=workers, progress=progress)
