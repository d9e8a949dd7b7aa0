"""The web corpora prepare.py downloads by name, from the Parquet files their publishers host.

    python prepare.py openwebtext                     # all of OpenWebText (~9B tokens)
    python prepare.py fineweb_edu --shards 1          # one file of FineWeb-Edu's 10BT sample
    python prepare.py fineweb_edu --sample 100BT      # the 100B-token sample

The files are listed through the Hub's tree API (with their sizes and sha256),
downloaded into data/NAME/download/ (as Tiny Shakespeare's input.txt is kept in
data/NAME/; gptkit/prepare/download.py: resumable, checked), then tokenized with
GPT-2 BPE file by file into data/NAME/{train.bin, val.bin, meta.json}
(gptkit/prepare/shards.py). A run that finds the same files already prepared
does nothing. The address is --base_url, else $HF_ENDPOINT (the variable the Hub's
own tools and its mirrors use), else https://huggingface.co; a folder there is a
local copy of the repository (as `huggingface-cli download --local-dir` leaves
one), read in place, its files checked by size only.
"""

import os
import sys
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from gptkit.ops.errors import UserError
from gptkit.ops.lock import FolderLock
from gptkit.ops.paths import TEMP_MARK

DEFAULT_BASE = "https://huggingface.co"
VAL_FRACTION = 0.0005  # nanoGPT's openwebtext/prepare.py holds out this share of documents


@dataclass(frozen=True)
class Corpus:
    repo: str
    revision: str
    samples: dict  # sample name -> folder in the repository
    default_sample: str
    about: str


CORPORA = {
    # The Hub's Parquet conversion of Skylion007/openwebtext (the dataset nanoGPT's prepare.py loads).
    "openwebtext": Corpus(
        "Skylion007/openwebtext", "refs/convert/parquet", {"all": "plain_text/train"}, "all",
        "OpenWebText: 8,013,769 web pages, ~9B GPT-2 tokens (nanoGPT's count)",
    ),
    "fineweb_edu": Corpus(
        "HuggingFaceFW/fineweb-edu", "main",
        {"10BT": "sample/10BT", "100BT": "sample/100BT", "350BT": "sample/350BT"}, "10BT",
        "FineWeb-Edu's samples of 10B, 100B or 350B GPT-2 tokens",
    ),
}


def base_url(given=None):
    return (given or os.environ.get("HF_ENDPOINT") or DEFAULT_BASE).rstrip("/")


def check_amount(name, sample, shards):
    corpus = CORPORA[name]
    sample = sample or corpus.default_sample
    if sample not in corpus.samples:
        raise UserError(f"{name} has no sample {sample!r}: choose one of {', '.join(corpus.samples)}")
    if shards is not None and shards < 1:
        raise UserError(f"--shards must be at least 1, got {shards}")
    return sample


def prepare_corpus(name, out_dir="data", *, sample=None, shards=None, base=None, workers=None, progress=True):
    """Download the first `shards` files (all when None) of `sample` and prepare data/NAME."""
    from gptkit.prepare.build import locked_dataset_folder, progress_bar
    from gptkit.prepare.download import list_files
    from gptkit.ops.paths import claim_output

    corpus = CORPORA[name]
    sample = check_amount(name, sample, shards)
    base = base_url(base)
    folder = claim_output(Path(out_dir) / name, "folder", overwrite=True, what="the dataset folder (--data_dir)")
    local = local_copy(base)
    if local is not None:  # a folder holding the repository's files: read in place
        files = local_files(local, corpus.samples[sample])
    else:
        files = list_files(base, corpus.repo, corpus.revision, corpus.samples[sample])
    if shards is not None:
        if shards > len(files):
            raise UserError(f"{name} {sample} has {len(files)} files; --shards {shards} asks for more")
        files = files[:shards]
    described = {
        "name": name, "repo": corpus.repo, "revision": corpus.revision, "sample": sample,
        "files": [{"path": f.path, "bytes": f.size, "sha256": f.sha256} for f in files],
    }
    if already_prepared(folder, described):
        if progress:
            print(f"{folder} already holds these {len(files)} file(s) of {name}: nothing to do", file=sys.stderr)
        return folder
    if local is not None:
        paths = [local / f.path for f in files]
    else:
        paths = download(name, sample, base, corpus, files, folder / "download", progress)
    with locked_dataset_folder(folder), progress_bar(progress, sum(f.size for f in files), "tokenize") as bar:
        meta = tokenize_files(folder, paths, described | {"url": base}, workers, bar)
    if progress:
        n = meta["num_tokens"]
        print(f"wrote {folder}: train {n['train']:,} tokens, val {n['val']:,} tokens", file=sys.stderr)
    return folder


def download(name, sample, base, corpus, files, downloads, progress):
    """Fetch the files into `downloads` (resuming, checked); their local paths."""
    from gptkit.prepare.build import progress_bar
    from gptkit.prepare.download import fetch, resolve_url

    downloads.mkdir(parents=True, exist_ok=True)
    total = sum(f.size for f in files)
    here = sum(f.size for f in files if (downloads / f.path).is_file())
    if progress:
        print(f"{name} {sample}: {len(files)} file(s) from {base}, {total / 1e9:,.2f} GB "
              f"({here / 1e9:,.2f} GB already in {downloads})", file=sys.stderr)
    lock = FolderLock(downloads, "prepare.py", "use another --data_dir")
    with lock, progress_bar(progress, total, "download") as bar:
        return [
            fetch(resolve_url(base, corpus.repo, corpus.revision, f.path), downloads / f.path, f.size, f.sha256, bar)
            for f in files
        ]


def local_copy(base):
    """The folder `base` names (a path, or a file:// URL), or None for a web address."""
    from gptkit.prepare.download import web_address

    if base.startswith("file://"):
        base = urllib.parse.unquote(urllib.parse.urlsplit(base).path)
    elif "://" in base:
        web_address(base, "--base_url")  # http(s): ftp://, data: and the like are not opened
        return None
    folder = Path(base).expanduser()
    if not folder.is_dir():
        raise UserError(f"--base_url {base} is neither a web address (https://...) nor a folder")
    return folder


def local_files(folder, sub):
    """The .parquet files of a local copy's `sub` folder as RemoteFiles (no published sha256)."""
    from gptkit.prepare.download import RemoteFile

    files = sorted(p for p in (folder / sub).glob("*.parquet") if p.is_file())
    if not files:
        raise UserError(f"{folder / sub} holds no .parquet files (a local copy keeps the repository's "
                        f"layout: {sub}/...)")
    return [RemoteFile(p.relative_to(folder).as_posix(), p.stat().st_size, None) for p in files]


def tokenize_files(folder, paths, described, workers, bar):
    """Tokenize the downloaded files (continuing a stopped run) and publish the dataset."""
    from gptkit.prepare.build import (
        FORMAT_VERSION, GPT2_VOCAB_SIZE, commit_dataset, default_workers, fingerprint, meta_json, write_synced,
    )
    from gptkit.prepare.encode import CHUNK_CHARS
    from gptkit.prepare.shards import STATE, encode_files, split_rule
    from gptkit.data.tokenizer import GPT2_EOT_ID

    workers = default_workers() if workers is None else max(1, int(workers))
    if sum(Path(p).stat().st_size for p in paths) < 2 * CHUNK_CHARS:
        workers = 1  # starting processes would cost more than it saves
    done, counts, building = encode_files(folder, paths, described["files"], VAL_FRACTION, workers, bar)
    meta = {
        "format_version": FORMAT_VERSION,
        "tokenizer": {"type": "gpt2"},
        "vocab_size": GPT2_VOCAB_SIZE,
        "dtype": "uint16",
        "eot_id": GPT2_EOT_ID,
        "num_tokens": counts,
        "sources": [  # each file's tokens too: a later run with more files keeps these
            {"path": str(p), "bytes": f["bytes"], "sha256": f["sha256"],
             "num_tokens": {"train": d["train"], "val": d["val"]}}
            for p, f, d in zip(paths, described["files"], done)
        ],
        "split": split_rule(VAL_FRACTION),
        "corpus": described,
    }
    meta["fingerprint"] = fingerprint(meta)
    tmp_meta = folder / f".meta.json{TEMP_MARK}{os.getpid()}"
    try:
        write_synced(tmp_meta, meta_json(meta))
        commit_dataset(folder, {"train.bin": building["train"], "val.bin": building["val"], "meta.json": tmp_meta},
                       ("train.bin", "val.bin", "meta.json"))
    finally:
        tmp_meta.unlink(missing_ok=True)
    (folder / STATE).unlink(missing_ok=True)
    return meta


def already_prepared(folder, described):
    """True when folder's meta.json was made from exactly these files."""
    import json

    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    found = meta.get("corpus") if isinstance(meta, dict) else None
    if not isinstance(found, dict):
        return False
    return {k: v for k, v in found.items() if k != "url"} == described and all(
        (folder / split).is_file() for split in ("train.bin", "val.bin")
    )
