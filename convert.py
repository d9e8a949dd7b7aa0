"""Convert a trained model to another format.

    python convert.py out-shakespeare-gpt2 hf-shakespeare --to hf     # a Hugging Face folder
    python convert.py out-mine/ckpt.pt hf-mine --to hf
    python convert.py out-gpt2-xl ckpt-xl.pt --to pt                 # an FSDP run's shards -> one file

--to hf writes config.json, model.safetensors and the tokenizer's files, so that
transformers' AutoModelForCausalLM and AutoTokenizer.from_pretrained(DEST) give our
logits and our token ids. GPT-2-shaped models become GPT2LMHeadModel, LLaMA-shaped
ones (RoPE, RMSNorm, SwiGLU, no biases) LlamaForCausalLM; any other architecture is
an error naming the settings that do not map (gptkit/interop/export.py).

--to pt turns the sharded checkpoint of an FSDP run (OUT_DIR/ckpt/) into one
ckpt.pt file, which any run resumes and sample.py reads (gptkit/train/sharded.py).
"""

import argparse

from gptkit.errors import UserError, run_main
from gptkit.paths import claim_output

FORMATS = {
    "hf": "a Hugging Face folder: model, config and tokenizer (transformers loads it)",
    "pt": "one ckpt.pt file from an FSDP run's sharded checkpoint (OUT_DIR or OUT_DIR/ckpt)",
}


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message):  # one line through run_main, not argparse's usage + exit
        raise UserError(f"{message} (see python convert.py --help)")


def build_parser():
    parser = ArgumentParser(
        prog="convert.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("source", metavar="OUT_DIR_OR_CKPT", help="a run folder (best.pt, else ckpt.pt) or a checkpoint file")
    parser.add_argument(
        "dest", metavar="DEST",
        help="--to hf: the folder to write (new or empty); --to pt: a new file. Checked before anything is "
        "loaded: an existing file, a folder where a file is meant, a device, a read-only folder or a name "
        "over 255 bytes is refused",
    )
    parser.add_argument(
        "--to", required=True, choices=sorted(FORMATS),
        help="; ".join(f"{name}: {what}" for name, what in FORMATS.items()),
    )
    parser.add_argument("--data_dir", default="data", help="where a nanoGPT checkpoint's meta.pkl is looked for")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    # Before anything is loaded: a destination that cannot be written fails in one line.
    dest = claim_output(args.dest, "folder" if args.to == "hf" else "file", what="DEST")
    if args.to == "hf":
        from gptkit.interop.export import export_hf  # imported here so --help stays quick

        print(export_hf(args.source, dest, data_dir=args.data_dir))
    elif args.to == "pt":
        from gptkit.train.sharded import sharded_to_single

        print(f"wrote {sharded_to_single(args.source, dest)}")
    return 0


if __name__ == "__main__":
    run_main(main)
