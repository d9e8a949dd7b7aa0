"""Convert a trained model to another format.

    python convert.py out-shakespeare-gpt2 hf-shakespeare --to hf     # a Hugging Face folder
    python convert.py out-mine/ckpt.pt hf-mine --to hf
    python convert.py out-gpt2-xl ckpt-xl.pt --to pt                 # an FSDP run's shards -> one file
    python convert.py out-shakespeare-llama shakespeare.gguf --to gguf [--outtype f32|f16|q8_0]

--to hf writes config.json, model.safetensors and the tokenizer's files, so that
transformers' AutoModelForCausalLM and AutoTokenizer.from_pretrained(DEST) give our
logits and our token ids. GPT-2-shaped models become GPT2LMHeadModel, LLaMA-shaped
ones (RoPE, RMSNorm, SwiGLU, no biases) LlamaForCausalLM; any other architecture is
an error naming the settings that do not map (gptkit/interop/export.py).

--to gguf writes one GGUF file, model and tokenizer, that llama.cpp, Ollama and LM
Studio run: GPT-2-shaped models as llama.cpp's gpt2, LLaMA-shaped ones as llama (qwen3
with QK-norm); other architectures are an error naming the settings that do not map
(gptkit/interop/gguf_export.py; docs/gguf.md shows how to run the file).

--to pt turns the sharded checkpoint of an FSDP run (OUT_DIR/ckpt/) into one
ckpt.pt file, which any run resumes and sample.py reads (gptkit/train/sharded.py; the format: gptkit/ops/sharded.py).
"""

import argparse

from gptkit.ops.errors import ArgumentParser, UserError, run_main
from gptkit.ops.paths import claim_output

FORMATS = {
    "hf": "a Hugging Face folder: model, config and tokenizer (transformers loads it)",
    "gguf": "one GGUF file for llama.cpp, Ollama and LM Studio (see --outtype)",
    "pt": "one ckpt.pt file from an FSDP run's sharded checkpoint (OUT_DIR or OUT_DIR/ckpt)",
}


def build_parser():
    parser = ArgumentParser(
        prog="convert.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("source", metavar="OUT_DIR_OR_CKPT", help="a run folder (best.pt, else ckpt.pt) or a checkpoint file")
    parser.add_argument(
        "dest", metavar="DEST",
        help="--to hf: the folder to write (new or empty); --to pt, gguf: a new file. Checked before anything "
        "is loaded: an existing file, a folder where a file is meant, a device, a read-only folder or a name "
        "over 255 bytes is refused",
    )
    parser.add_argument(
        "--to", required=True, choices=sorted(FORMATS),
        help="; ".join(f"{name}: {what}" for name, what in FORMATS.items()),
    )
    parser.add_argument(
        "--outtype", default=None, choices=("f32", "f16", "q8_0"),
        help="--to gguf: the weights' type, default f16 (half the size of f32; q8_0 about a quarter)",
    )
    parser.add_argument("--data_dir", default="data", help="where a nanoGPT checkpoint's meta.pkl is looked for")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.outtype and args.to != "gguf":
        raise UserError(f"--outtype applies to --to gguf only, not --to {args.to}")
    # Before anything is loaded: a destination that cannot be written fails in one line.
    dest = claim_output(args.dest, "folder" if args.to == "hf" else "file", what="DEST")
    if args.to == "hf":
        from gptkit.interop.export import export_hf  # imported here so --help stays quick

        print(export_hf(args.source, dest, data_dir=args.data_dir))
    elif args.to == "gguf":
        from gptkit.interop.gguf_export import export_gguf

        print(export_gguf(args.source, dest, outtype=args.outtype or "f16", data_dir=args.data_dir))
    elif args.to == "pt":
        from gptkit.train.sharded import sharded_to_single

        print(f"wrote {sharded_to_single(args.source, dest)}")
    return 0


if __name__ == "__main__":
    run_main(main)
