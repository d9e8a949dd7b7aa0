"""Turn text into training data: data/NAME/{train.bin, val.bin, meta.json}.

    python prepare.py shakespeare_char         # Tiny Shakespeare, one token per character
    python prepare.py shakespeare              # Tiny Shakespeare, GPT-2 BPE (tiktoken)
    python prepare.py --input notes.txt books/ web.jsonl --tokenizer gpt2 --name mine
    python prepare.py --input books/ --tokenizer bpe --vocab_size 4096 --name books   # your own BPE
    python prepare.py talks --input talks.jsonl --format chat  # conversations (docs/chat.md)
    python prepare.py fineweb_edu --shards 1   # web corpora by name: openwebtext, fineweb_edu (docs/data.md)
    python prepare.py --input pages/ --tokenizer gpt2 --name pages   # .parquet files, their text column

What the files hold and how they are written: gptkit/prepare/build.py.
"""

import argparse

from gptkit.ops.errors import quiet_start

quiet_start()  # a Ctrl-C or a missing package while the imports below load: one line, no traceback
from gptkit.ops.errors import ArgumentParser, UserError, run_main
from gptkit.prepare.build import (CONVERSATION_SETS, DOWNLOADED_CORPORA, NAMED_DATASETS, check_dataset_name,
                                  prepare_dataset)
from gptkit.prepare.named import prepare_named
from gptkit.prepare.shakespeare import SHAKESPEARE_URL


# ---------------------------------------------------------------- command line

EPILOG = (
    """\
examples:
  python prepare.py shakespeare_char
      Tiny Shakespeare, character-level -> data/shakespeare_char (1,003,854 / 111,540 tokens)
  python prepare.py shakespeare --input ~/input.txt
      the same text with GPT-2 BPE, from a local copy -> data/shakespeare (301,966 / 36,059 tokens)
  python prepare.py --input my_notes.txt books/ web.jsonl --tokenizer gpt2 --name mine
      your own text -> data/mine
  python prepare.py --input books/ --tokenizer bpe --vocab_size 4096 --name books
      a 4,096-token byte-level BPE trained on the training split of books/ -> data/books
      (with data/books/tokenizer.json); --tokenizer_from data/books reuses it for other text
  python prepare.py talks --input talks.jsonl --format chat [--tokenizer char|gpt2|bpe] [--block_size N]
      conversations, one {"messages": [...]} a line (or a folder of such files) -> data/talks
      with a target mask per split (docs/chat.md); python prepare.py arithmetic_chat makes some,
      multiply_tools and multiply_plain products with and without calculator calls, gsm8k_chat
      GSM8K's worked answers with their annotations as calculator calls (downloaded, or --input FILE)
  python prepare.py no_robots [--block_size N] [--shards N]
      a public conversation set (no_robots, smoltalk) by name: its Parquet files downloaded as the
      corpora's are, its messages prepared as chat data with GPT-2 BPE -> data/no_robots
  python prepare.py openwebtext
      OpenWebText (~9B tokens) as nanoGPT trains GPT-2 on: its Parquet files downloaded from the
      Hugging Face Hub into data/openwebtext/download, checked, tokenized with GPT-2 BPE
  python prepare.py fineweb_edu [--sample 10BT|100BT|350BT] [--shards N]
      FineWeb-Edu's 10B-token sample (or the first N files of a sample). Both resume where a
      stopped run was; --base_url URL or HF_ENDPOINT=URL for a mirror or a local copy

inputs: a text file is one document; a folder is every .txt and .parquet file below it
(sorted); a .jsonl file is one document per line, in its "text" field; a .parquet file is
one document per row, in its text column (--text_column NAME for another); - (standard
input), a named pipe or <(zcat corpus.gz) is one document, copied once into data/NAME. One document
is split at --val_fraction of its characters (as nanoGPT); several documents are split by
whole documents, evenly spaced. With GPT-2 BPE and several documents, the end-of-text token
(50256) follows each document; with a trained BPE, <|endoftext|> (its last id) does.

Tiny Shakespeare is read from --input, else $TINYSHAKESPEARE, else data/NAME/input.txt (a
verified earlier download), else downloaded from
  """
    + SHAKESPEARE_URL
    + """
and checked against its sha256. Offline: TINYSHAKESPEARE=/path/to/input.txt python prepare.py shakespeare_char

output: data/NAME/train.bin and val.bin (raw little-endian ids, uint16 or uint32) and
meta.json (tokenizer, counts, sources, split), plus tokenizer.json for a trained BPE, written to temporary files and renamed into
place at the end (meta.json last): an interrupted run leaves the previous dataset or none.
GPT-2 BPE needs tiktoken's files: offline, set TIKTOKEN_CACHE_DIR to a folder holding them.
"""
)


def build_parser():
    parser = ArgumentParser(
        prog="prepare.py",
        description="Tokenize text into data/NAME/{train.bin, val.bin, meta.json} for train.py.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("dataset", nargs="?", help=f"a named dataset: {', '.join(NAMED_DATASETS)}; "
                        "with --format chat, the name of yours")
    parser.add_argument(
        "--input", nargs="+", metavar="PATH",
        help="text file(s), .jsonl or .parquet file(s), folder(s) of .txt and .parquet, a pipe or <(command), "
        "or - for standard input",
    )
    parser.add_argument(
        "--text_column", default=None, metavar="NAME",
        help="the column of .parquet inputs that holds the text (default text)",
    )
    parser.add_argument(
        "--tokenizer",
        metavar="{char,gpt2,bpe}",
        help="char (one id per distinct character), gpt2 (tiktoken BPE) or bpe (trained on your text)",
    )
    parser.add_argument(
        "--vocab_size", type=int, default=None, metavar="N", help="with --tokenizer bpe: train N ids (at least 257)"
    )
    parser.add_argument(
        "--tokenizer_from",
        metavar="PATH",
        help="with --tokenizer bpe: reuse the BPE of a dataset folder, out_dir or checkpoint instead of training",
    )
    parser.add_argument(
        "--name",
        help="output folder name under --data_dir (with your own --input); checked, with --data_dir, before "
        "any input is read: a folder you cannot write to or a name over 255 bytes fails at once",
    )
    parser.add_argument(
        "--val_fraction", type=float, default=None, metavar="F", help="share held out for validation (default 0.1)"
    )
    parser.add_argument(  # train.py's name for it; --out_dir is the older spelling, kept for scripts
        "--data_dir", "--out_dir", dest="data_dir", default="data", metavar="DIR",
        help="where dataset folders go, as train.py's --data_dir (default data; --out_dir also works)",
    )
    parser.add_argument(
        "--errors",
        default="strict",
        metavar="{strict,replace,skip}",
        help="invalid UTF-8: strict (stop, default) or replace (U+FFFD); --format chat: strict or skip (bad lines, counted)",
    )
    parser.add_argument(
        "--workers", type=int, default=None, metavar="N", help="tokenizer processes (default: all cores)"
    )
    parser.add_argument(
        "--format", default="text", metavar="{text,chat}",
        help="chat: --input is jsonl conversations ({\"messages\": [...]} a line) or a folder of them; "
        "the dataset is named by NAME or --name, the tokenizer defaults to gpt2 (docs/chat.md)",
    )
    parser.add_argument(
        "--block_size", type=int, default=None, metavar="N",
        help="with --format chat: a conversation longer than N + 1 tokens is an error (or skipped with --errors skip)",
    )
    parser.add_argument(
        "--sample", metavar="NAME", help="fineweb_edu: which published sample, 10BT (default), 100BT or 350BT",
    )
    parser.add_argument(
        "--shards", type=int, default=None, metavar="N",
        help="openwebtext, fineweb_edu: only the first N Parquet files (default: all of the sample)",
    )
    parser.add_argument(
        "--base_url", metavar="URL",
        help="openwebtext, fineweb_edu: where the files are: the Hub or a mirror (default $HF_ENDPOINT, else "
        "https://huggingface.co), or a folder holding a local copy of the repository",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    progress = not args.quiet
    if args.format not in ("text", "chat"):
        raise UserError(f"--format must be text or chat, got {args.format!r}")
    if args.format == "chat":
        return prepare_chat_command(args, progress)
    if args.block_size is not None and args.dataset not in CONVERSATION_SETS:
        raise UserError("--block_size goes with --format chat or a conversation set (a text dataset is cut into "
                        "windows by train.py)")
    if args.dataset is not None:
        check_dataset_name(args.dataset)
        own = (args.tokenizer, args.name, args.val_fraction, args.vocab_size, args.tokenizer_from, args.text_column)
        if any(v is not None for v in own):
            raise UserError(
                f"{args.dataset} fixes the tokenizer, name and split; --tokenizer, --name, --val_fraction, "
                "--vocab_size, --tokenizer_from and --text_column go with --input for your own data"
            )
        amount = {k: v for k in ("sample", "shards", "base_url") if (v := getattr(args, k)) is not None}
        if args.dataset in CONVERSATION_SETS:
            if args.input is not None or args.errors != "strict" or "sample" in amount:
                raise UserError(f"{args.dataset} is downloaded whole (--shards N: its first N files; --block_size N: "
                                "conversations that fit; the ones that do not are left out and counted)")
            amount = {"shards": amount.get("shards"), "base": amount.get("base_url"), "block_size": args.block_size}
        elif args.dataset in DOWNLOADED_CORPORA:
            if args.errors != "strict":
                raise UserError(f"{args.dataset} is published as valid UTF-8: --errors goes with --input")
            if args.input is not None:
                raise UserError(f"{args.dataset} is downloaded: for local Parquet files use --input PATH "
                                "--tokenizer gpt2 --name NAME (or --base_url for a mirror)")
            amount["base"] = amount.pop("base_url", None)
        elif args.input is not None and len(args.input) != 1:
            raise UserError(f"{args.dataset} takes one --input file (a copy of Tiny Shakespeare)")
        input_path = args.input[0] if args.input else None
        prepare_named(args.dataset, args.data_dir, input_path, workers=args.workers, progress=progress, **amount)
        return 0
    if args.input is None:
        raise UserError(
            f"nothing to prepare: give a dataset name ({', '.join(NAMED_DATASETS)}) or "
            "--input PATH --tokenizer {char,gpt2,bpe} --name NAME (see python prepare.py --help)"
        )
    if args.tokenizer is None:
        raise UserError("--input needs --tokenizer char, gpt2 or bpe (with --vocab_size N)")
    if args.name is None:
        raise UserError("--input needs --name NAME: the dataset goes to <data_dir>/NAME")
    prepare_dataset(
        args.input,
        args.tokenizer,
        args.name,
        args.data_dir,
        0.1 if args.val_fraction is None else args.val_fraction,
        args.errors,
        args.workers,
        progress,
        vocab_size=args.vocab_size,
        tokenizer_from=args.tokenizer_from,
        text_column=args.text_column or "text",
    )
    return 0


def prepare_chat_command(args, progress):
    from gptkit.prepare.chat import prepare_chat

    if args.input is None:
        raise UserError("--format chat needs --input FILE_OR_DIR (jsonl conversations, or a folder of them)")
    if (args.dataset is None) == (args.name is None):
        raise UserError("--format chat needs the dataset's name once: python prepare.py NAME --input FILE --format chat")
    prepare_chat(
        args.input,
        args.tokenizer or "gpt2",
        args.dataset or args.name,
        args.data_dir,
        0.1 if args.val_fraction is None else args.val_fraction,
        args.errors,
        args.block_size,
        vocab_size=args.vocab_size,
        tokenizer_from=args.tokenizer_from,
        progress=progress,
    )
    return 0


if __name__ == "__main__":
    run_main(main)
