"""Tokenizing a downloaded corpus file by file, so that a stopped run continues.

A web corpus is many Parquet files (gptkit/prepare/corpora.py) and hours of
tokenizing. Each file's tokens are appended, in file order, to
train.bin.building and val.bin.building in the dataset folder; after each file
the two are flushed to disk and building.json records the file (path, sha256)
and the token counts so far. A run that finds building.json cuts the two files
back to its last record (what a killed run wrote after it is dropped) and goes
on with the next file: a finished file is never tokenized again. At the end the
two files and meta.json are renamed into place as build.py does (the previous
dataset stays whole until then).

The split is per file, so that it does not depend on how many files there are:
row r of a file of R rows is val when (r + 1) * V // R > r * V // R, with
V = min(max(1, round(R * val_fraction)), R - 1): V evenly spaced documents.
Every document is followed by GPT-2's end-of-text token; empty rows are skipped.
"""

import json
import os
import secrets
import sys
import time
from pathlib import Path

import numpy as np

from gptkit.ops import faults
from gptkit.ops.errors import UserError
from gptkit.ops.paths import TEMP_MARK
from gptkit.prepare.encode import build_tasks, dtype_for, encode_task, gpt2_cut, make_pool, ordered_map, stop_pool
from gptkit.prepare.parquet import open_parquet, parquet_texts
from gptkit.prepare.sources import Source
from gptkit.data.tokenizer import GPT2_EOT_ID

GPT2_VOCAB_SIZE = 50257
STATE = "building.json"
BUILDING = {"train": "train.bin.building", "val": "val.bin.building"}


def val_count(rows, val_fraction):
    return min(max(1, round(rows * val_fraction)), rows - 1) if rows > 1 else 0


def row_split(rows, val_fraction):
    """split(r) for the rows of one file: 'val' for V evenly spaced rows, else 'train'."""
    n_val = val_count(rows, val_fraction)
    return lambda r: "val" if (r + 1) * n_val // rows > r * n_val // rows else "train"


def read_state(folder, files):
    """The files already tokenized ([{path, sha256, train, val}]) that begin `files`, in order."""
    try:
        state = json.loads((folder / STATE).read_text(encoding="utf-8"))
        return read_state_from(list(state["done"]), files)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []


def write_state(folder, done):
    tmp = folder / f".{STATE}{TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"done": done}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / STATE)


def file_segments(path, val_fraction, bar):
    """(split, pieces, append_eot) for each non-empty row of one Parquet file."""
    source = Source(Path(path), "parquet", str(path))
    split = row_split(open_parquet(source.path, source.shown, "text")[1], val_fraction)
    for r, text in enumerate(parquet_texts(source, "strict", lambda block: bar.update(len(block)))):
        if text:  # an empty row is no document, but keeps its number
            yield split(r), iter((text,)), True


def reopen_published(folder, files):
    """When folder holds a published corpus dataset that shares its first files with `files`
    (a run asking for more files, or fewer), turn it back into .building files with their
    building.json, so those files are not tokenized again. The dataset is unavailable from
    here until the new one is published: meta.json goes first (a stop between the renames
    leaves no dataset that looks complete, and at worst a run that starts again)."""
    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        done = [{"path": f["path"], "sha256": f["sha256"], "bytes": f["bytes"], **s["num_tokens"]}
                for f, s in zip(meta["corpus"]["files"], meta["sources"])]
    except (OSError, ValueError, KeyError, TypeError):
        return
    if not all(isinstance(d.get("train"), int) and isinstance(d.get("val"), int) for d in done):
        return
    if (folder / STATE).exists() or not read_state_from(done, files):
        return
    if not all((folder / f"{split}.bin").is_file() for split in BUILDING):
        return
    write_state(folder, done)
    (folder / "meta.json").unlink()
    for split, name in BUILDING.items():
        os.replace(folder / f"{split}.bin", folder / name)


def read_state_from(done, files):
    kept = []
    for entry, f in zip(done, files):
        if (entry.get("path"), entry.get("sha256"), entry.get("bytes")) != (f["path"], f["sha256"], f["bytes"]):
            break
        kept.append(entry)
    return kept


def encode_files(folder, paths, files, val_fraction, workers, bar):
    """Tokenize paths[i] (described by files[i]: path, sha256) into the .building files,
    continuing after the files building.json records. Returns (done entries, token counts,
    the two .building files)."""
    reopen_published(folder, files)
    done = read_state(folder, files)
    dtype = dtype_for(GPT2_VOCAB_SIZE)
    itemsize = np.dtype(dtype).itemsize
    counts = {"train": sum(d["train"] for d in done), "val": sum(d["val"] for d in done)}
    targets = {s: folder / name for s, name in BUILDING.items()}
    if not all(t.is_file() and t.stat().st_size >= counts[s] * itemsize for s, t in targets.items()):
        done, counts = [], {"train": 0, "val": 0}  # the files are not what building.json says: start again
    for split, target in targets.items():
        open(target, "ab").close()
        os.truncate(target, counts[split] * itemsize)  # drop what a stopped run wrote after its last record
    if done:
        print(f"continuing: {len(done)} of {len(paths)} file(s) already tokenized", file=sys.stderr)
        bar.update(sum(Path(p).stat().st_size for p in paths[: len(done)]))
    pool = make_pool(workers, ("gpt2", None, dtype, GPT2_EOT_ID))
    try:
        with open(targets["train"], "ab") as f_train, open(targets["val"], "ab") as f_val:
            out = {"train": f_train, "val": f_val}
            t0 = time.perf_counter()
            for path, f in zip(paths[len(done):], files[len(done):]):
                before = dict(counts)
                tasks = build_tasks(file_segments(path, val_fraction, bar), gpt2_cut)
                for train_bytes, val_bytes, _ in ordered_map(pool, encode_task, tasks, workers):
                    for split, data in (("train", train_bytes), ("val", val_bytes)):
                        out[split].write(data)
                        counts[split] += len(data) // itemsize
                    rate = (counts["train"] + counts["val"]) / max(time.perf_counter() - t0, 1e-9)
                    bar.set_postfix_str(f"{rate:,.0f} tok/s", refresh=False)
                for g in out.values():
                    g.flush()
                    os.fsync(g.fileno())
                done.append({"path": f["path"], "sha256": f["sha256"], "bytes": f["bytes"],
                             "train": counts["train"] - before["train"], "val": counts["val"] - before["val"]})
                write_state(folder, done)
                faults.maybe_exit("exit_after_first_file")  # test-only: die with one file recorded
    finally:
        if pool is not None:
            stop_pool(pool)
    if counts["train"] == 0 or counts["val"] == 0:
        raise UserError(f"the files hold too little text for a train and a val split ({counts})")
    return done, counts, targets


def split_rule(val_fraction):
    return {
        "rule": "per file, whole documents: with R rows and V = min(max(1, round(R * val_fraction)), R - 1), "
        "row r (from 0) is val when (r + 1) * V // R > r * V // R; empty rows are skipped",
        "val_fraction": val_fraction,
    }
