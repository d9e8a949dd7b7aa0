"""A checkpoint out as a Hugging Face folder: the model and its tokenizer.

    python convert.py out-shakespeare-gpt2 hf-shakespeare --to hf
    python -c "import transformers as t; m = t.AutoModelForCausalLM.from_pretrained('hf-shakespeare')"

The architecture is chosen from the model's settings: GPT-2's (learned positions,
LayerNorm, GELU, biases, tied embeddings) becomes a GPT2LMHeadModel
(gptkit/interop/hf_gpt2.py), LLaMA's (RoPE, RMSNorm, SwiGLU, no biases) a
LlamaForCausalLM (gptkit/interop/hf_llama.py); both give our logits. Anything else
is an error naming, for each, the settings that do not map: transformers would
load the weights into a model that computes something else.

The folder is written under a temporary name beside DEST and renamed at the end,
so an error or Ctrl-C halfway never leaves a folder that looks complete.
"""

import json
from pathlib import Path

from safetensors import SafetensorError

from gptkit.ops.atomic import atomic_write
from gptkit.data.chat import chat_vocabulary
from gptkit.ops.errors import RunFailed, UserError
from gptkit.interop import check_mapped_names, missing_weight
from gptkit.interop.hf_gpt2 import export_gpt2, gpt2_mismatches
from gptkit.interop.hf_llama import export_llama, llama_mismatches
from gptkit.interop.hf_tokenizer import write_tokenizer
from gptkit.models.loading import load_model
from gptkit.ops.paths import claim_output, shown


# Named by the refusal; tests/interop/test_export.py checks that each still exports.
EXPORTING_CONFIGS = ("LLaMA's architecture (configs/shakespeare_llama.py trains one on a CPU in minutes) "
                     "or GPT-2's (configs/gpt2.py)")


def hf_architecture(config):
    """'gpt2' or 'llama': the transformers architecture that computes what `config` does."""
    gpt2, llama = gpt2_mismatches(config), llama_mismatches(config)
    if not gpt2:
        return "gpt2"
    if not llama:
        return "llama"
    raise UserError(
        "this model maps onto no Hugging Face architecture we export, nothing was written: as GPT-2 it has "
        + ", ".join(gpt2) + "; as LLaMA it has " + ", ".join(llama)
        + f". Models that export: {EXPORTING_CONFIGS}"
    )


def load_source(source, data_dir="data"):
    """(model, tokenizer, summary) from a checkpoint file or an out_dir (best.pt, else ckpt.pt)."""
    path = Path(source)
    if path.is_dir():
        return load_model(out_dir=path, data_dir=data_dir)
    if not path.exists():
        raise UserError(f"{source} does not exist: give a run folder (out_dir) or a checkpoint file")
    return load_model(ckpt=path, data_dir=data_dir)


def end_generation_at(config_path, token_id):
    """A chat model's reply ends with its turn: <|end|> as the eos_token_id that
    transformers' generate stops at."""
    config = json.loads(config_path.read_text())
    config["eos_token_id"] = token_id
    config_path.write_text(json.dumps(config, indent=2) + "\n")


def export_hf(source, dest, data_dir="data"):
    """Write the model in `source` and its tokenizer as a Hugging Face folder `dest`;
    returns a one-line summary."""
    dest = claim_output(dest, "folder", what="DEST")  # new or empty; convert.py checked it before loading too
    model, tokenizer, summary = load_source(source, data_dir)
    architecture = hf_architecture(model.config)  # before anything is written
    check_mapped_names(model.state_dict(), "--to hf")
    # A new folder: published only if nothing appeared there meanwhile (gptkit/ops/atomic.py).
    try:
        with atomic_write(dest, replace=False, folder=True) as tmp:
            turns = chat_vocabulary(model.config.vocab_size, tokenizer.vocab_size)  # a chat model's turn tokens
            eot = write_tokenizer(tokenizer.to_dict(), tmp, model.config.block_size, turns)
            try:
                if architecture == "gpt2":
                    export_gpt2(model, tmp, eos_token_id=eot)
                else:
                    export_llama(model, tmp, eos_token_id=eot)
            except KeyError as e:
                raise missing_weight(e, "--to hf")
            if turns is not None:
                end_generation_at(tmp / "config.json", turns["<|end|>"])
    except SafetensorError as e:  # a full disk (safetensors says "I/O error"): the environment failed
        raise RunFailed(f"could not write {shown(dest)}: {str(e).splitlines()[0]} (nothing was left behind)")
    kind = "GPT2LMHeadModel" if architecture == "gpt2" else "LlamaForCausalLM"
    return f"{summary}\nwrote {dest}: {kind} and its {tokenizer.to_dict()['type']} tokenizer"
