"""Public conversation sets prepare.py downloads by name, from the Parquet files their
publishers host, prepared as chat data (GPT-2 BPE).

    python prepare.py no_robots                       # No Robots: 10,000 conversations written by people
    python prepare.py smoltalk --shards 1             # the first file of SmolTalk's "all" set
    python prepare.py no_robots --block_size 512      # leave out conversations longer than 513 tokens

The files are listed and fetched as the web corpora's are (gptkit/prepare/corpora.py and
download.py: the tree API's sizes and sha256, downloads into data/NAME/download/ that
resume where a stopped run was and are checked, --base_url or $HF_ENDPOINT for a mirror
or a local copy). Each file's "messages" column (the form docs/chat.md reads) is
written to data/NAME/conversations.jsonl, which is prepared as any chat input: a
conversation longer than --block_size + 1 tokens (default 1024, GPT-2's context) or one
the chat reader refuses is left out and counted.
"""

import json
from pathlib import Path

from gptkit.ops.errors import UserError
from gptkit.prepare.corpora import Corpus, base_url, download, local_copy, local_files

SETS = {
    "no_robots": Corpus("HuggingFaceH4/no_robots", "main", {"all": "data"}, "all",
                        "No Robots: 9,500 train and 500 test conversations written by people"),
    "smoltalk": Corpus("HuggingFaceTB/smoltalk", "main", {"all": "data/all"}, "all",
                       "SmolTalk's mix of ~1M synthetic conversations (its 'all' set)"),
}
DEFAULT_BLOCK_SIZE = 1024


def prepare_conversation_set(name, out_dir="data", *, shards=None, base=None, block_size=None, progress=True):
    """Download the first `shards` files (all when None) of the set and prepare data/NAME."""
    from gptkit.ops.paths import claim_output
    from gptkit.prepare.chat import prepare_chat
    from gptkit.prepare.download import list_files

    corpus = SETS[name]
    if shards is not None and shards < 1:
        raise UserError(f"--shards must be at least 1, got {shards}")
    base = base_url(base)
    folder = claim_output(Path(out_dir) / name, "folder", overwrite=True, what="the dataset folder (--data_dir)")
    local = local_copy(base)
    sub = corpus.samples[corpus.default_sample]
    files = local_files(local, sub) if local is not None else list_files(base, corpus.repo, corpus.revision, sub)
    if shards is not None:
        if shards > len(files):
            raise UserError(f"{name} has {len(files)} files; --shards {shards} asks for more")
        files = files[:shards]
    if local is not None:
        paths = [local / f.path for f in files]
    else:
        paths = download(name, corpus.default_sample, base, corpus, files, folder / "download", progress)
    source = write_conversations(paths, folder / "conversations.jsonl")
    return prepare_chat([source], "gpt2", name, out_dir, errors="skip",
                        block_size=DEFAULT_BLOCK_SIZE if block_size is None else block_size, progress=progress)


def write_conversations(paths, dest):
    """Each Parquet file's "messages" column, one {"messages": [...]} a line, into `dest`;
    a file that is not Parquet or has no such column is a UserError naming it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with open(dest, "w", encoding="utf-8") as f:
        for path in paths:
            try:
                parquet = pq.ParquetFile(path)
                if "messages" not in parquet.schema_arrow.names:
                    raise UserError(f"{path} has no \"messages\" column (its columns: "
                                    f"{', '.join(parquet.schema_arrow.names)}): not a conversation set's file")
                for batch in parquet.iter_batches(columns=["messages"], batch_size=1024):
                    for messages in batch.column(0).to_pylist():
                        f.write(json.dumps({"messages": messages}) + "\n")
            except (OSError, pa.ArrowException, ValueError) as e:
                reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise UserError(f"{path} is not a readable Parquet file ({reason[:200]})") from None
    return dest
