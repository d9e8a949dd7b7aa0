"""Other projects' formats: Hugging Face GPT-2 weights, nanoGPT checkpoints."""

import re

from gptkit.ops.errors import UserError

# The parameter names of model.py as written (N: a block's number), which the exports map
# onto other programs' names (Hugging Face, llama.cpp) one by one.
MAPPED_NAMES = re.compile(
    r"transformer\.(wte|wpe)\.weight|transformer\.ln_f\.(weight|bias)|lm_head\.weight"
    r"|transformer\.h\.\d+\.(ln_1|ln_2)\.(weight|bias)"
    r"|transformer\.h\.\d+\.attn\.(c_attn|c_proj)\.(weight|bias)|transformer\.h\.\d+\.attn\.(q_norm|k_norm)\.weight"
    r"|transformer\.h\.\d+\.mlp\.(c_fc|c_proj)\.(weight|bias)"
)


def check_mapped_names(state, target):
    """UserError, before anything is written, unless every name in the state dict is one
    the export to `target` maps: a module renamed or added in model.py would otherwise be
    left out of the file, or written under a name the other program never reads."""
    unknown = [name for name in state if not MAPPED_NAMES.fullmatch(name)]
    if unknown:
        raise UserError(f"{target} maps model.py's modules by their names as written, and this model holds "
                        f"{len(unknown)} weight(s) it has no place for ({', '.join(unknown[:3])}"
                        f"{', ...' if len(unknown) > 3 else ''}): a module renamed or added in model.py; rename it "
                        "back, or map it in gptkit/interop/ (nothing was written)")


def missing_weight(error, target):
    """The UserError for a KeyError of an export's map: a module model.py no longer has."""
    return UserError(f"{target} needs the weight {error.args[0]}, which this model.py's GPT does not hold (a module "
                     "removed or renamed in model.py; nothing was written)")
