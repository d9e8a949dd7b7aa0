"""The datasets prepare.py, and train.py on first use, build by name.

    python prepare.py shakespeare_char      # Tiny Shakespeare (gptkit/prepare/build.py)
    python prepare.py arithmetic_chat       # conversations of sums (gptkit/prepare/arithmetic.py)
    python prepare.py fineweb_edu           # a web corpus's Parquet files (gptkit/prepare/corpora.py)
"""

from gptkit.ops.errors import UserError
from gptkit.prepare.build import DOWNLOADED_CORPORA, check_dataset_name, prepare_named_dataset


def prepare_named(name, out_dir="data", input_path=None, *, workers=None, progress=True, **amount):
    """Prepare the named dataset into out_dir/name; return the folder. `amount`: a web
    corpus's sample, shards and base (gptkit/prepare/corpora.py)."""
    check_dataset_name(name)
    if name in DOWNLOADED_CORPORA:
        from gptkit.prepare.corpora import prepare_corpus

        return prepare_corpus(name, out_dir, workers=workers, progress=progress, **amount)
    if amount:
        corpora = ", ".join(DOWNLOADED_CORPORA)
        raise UserError(f"--sample, --shards and --base_url go with a downloaded corpus ({corpora})")
    if name == "arithmetic_chat":
        from gptkit.prepare.arithmetic import prepare_arithmetic_chat

        return prepare_arithmetic_chat(out_dir, input_path, progress=progress)
    return prepare_named_dataset(name, out_dir, input_path, workers=workers, progress=progress)
