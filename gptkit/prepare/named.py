"""The datasets prepare.py, and train.py on first use, build by name.

    python prepare.py shakespeare_char      # Tiny Shakespeare (gptkit/prepare/build.py)
    python prepare.py arithmetic_chat       # conversations of sums (gptkit/prepare/arithmetic.py)
    python prepare.py multiply_tools        # products answered with the calculator (the same file)
    python prepare.py gsm8k_chat            # GSM8K's worked answers, their annotations as calculator calls
    python prepare.py no_robots             # a public conversation set's Parquet files (conversations.py)
    python prepare.py fineweb_edu           # a web corpus's Parquet files (gptkit/prepare/corpora.py)
"""

from gptkit.ops.errors import UserError
from gptkit.prepare.build import (CONVERSATION_SETS, DOWNLOADED_CORPORA, GENERATED_CHATS, check_dataset_name,
                                  prepare_named_dataset)


def prepare_named(name, out_dir="data", input_path=None, *, workers=None, progress=True, **amount):
    """Prepare the named dataset into out_dir/name; return the folder. `amount`: a web
    corpus's sample, shards and base (gptkit/prepare/corpora.py)."""
    check_dataset_name(name)
    if name in DOWNLOADED_CORPORA:
        from gptkit.prepare.corpora import prepare_corpus

        return prepare_corpus(name, out_dir, workers=workers, progress=progress, **amount)
    if name in CONVERSATION_SETS:
        from gptkit.prepare.conversations import prepare_conversation_set

        return prepare_conversation_set(name, out_dir, progress=progress, **amount)
    if amount:
        corpora = ", ".join(DOWNLOADED_CORPORA)
        raise UserError(f"--sample, --shards and --base_url go with a downloaded corpus ({corpora})")
    if name == "gsm8k_chat":
        from gptkit.prepare.gsm8k import prepare_gsm8k_chat

        return prepare_gsm8k_chat(out_dir, input_path, progress=progress)
    if name in GENERATED_CHATS:
        from gptkit.prepare.arithmetic import prepare_generated

        return prepare_generated(name, out_dir, input_path, progress=progress)
    return prepare_named_dataset(name, out_dir, input_path, workers=workers, progress=progress)
