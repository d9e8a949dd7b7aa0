"""Our GPT out as a Hugging Face LlamaForCausalLM, when its architecture is LLaMA's.

LLaMA (Touvron et al. 2023) is a pre-norm decoder with RMSNorm, rotary positions,
a SwiGLU MLP and no biases: `pos_encoding="rope", norm="rmsnorm", mlp="swiglu",
bias=False` here (see configs/llama2_7b.py). The weights map one to one, with two
splits: our fused `c_attn` is [q | k | v] and our fused `c_fc` is [gate | up].

No permutation of q and k is needed: model.apply_rope pairs dimension i with
i + D/2 (the two halves), which is the layout transformers' `rotate_half` uses.
(Meta's original checkpoints pair neighbours, which is why their conversion to
transformers permutes q and k; ours already has the halves layout.)

    python convert.py out-llama hf-llama --to hf
"""

import json
from pathlib import Path

from safetensors.torch import save_file

from gptkit.ops.errors import UserError
from model import NORM_EPS

# GPTConfig field -> (the value LLaMA needs, why it matters); fields not named here either
# map (n_layer, n_head, n_kv_head, mlp_hidden, rope_theta, tie_embeddings, ...) or do not
# change the function (dropout at inference, attention, zero_init_proj, pad_vocab_multiple).
LLAMA_NEEDS = {
    "pos_encoding": "rope",
    "norm": "rmsnorm",
    "norm_placement": "pre",
    "mlp": "swiglu",
    "bias": False,
    "qk_norm": False,
    "logit_softcap": None,
}


def llama_mismatches(c):
    """What in GPTConfig `c` a LlamaForCausalLM cannot hold, as 'setting=value (LLaMA needs ...)'."""
    return [
        f"{name}={getattr(c, name)!r} (LLaMA needs {need!r})"
        for name, need in LLAMA_NEEDS.items()
        if getattr(c, name) != need
    ]


HF_NAMES = {  # llama_block's roles -> transformers' LlamaDecoderLayer names
    "attn_norm": "input_layernorm.weight", "q": "self_attn.q_proj.weight", "k": "self_attn.k_proj.weight",
    "v": "self_attn.v_proj.weight", "o": "self_attn.o_proj.weight", "ffn_norm": "post_attention_layernorm.weight",
    "gate": "mlp.gate_proj.weight", "up": "mlp.up_proj.weight", "down": "mlp.down_proj.weight",
}


def llama_block(sd, c, i):
    """Block i of our state dict `sd` as LLaMA's separate matrices, by role: our c_attn
    split into q, k, v and our SwiGLU c_fc into gate and up (what every LLaMA-shaped
    format stores apart). Each (out, in), as nn.Linear keeps them."""
    p = f"transformer.h.{i}."
    H, Hkv, D = c.n_head, c.kv_heads, c.head_dim
    q_w, k_w, v_w = sd[p + "attn.c_attn.weight"].split([H * D, Hkv * D, Hkv * D], dim=0)
    gate, up = sd[p + "mlp.c_fc.weight"].split([c.hidden_size, c.hidden_size], dim=0)
    return {"attn_norm": sd[p + "ln_1.weight"], "q": q_w, "k": k_w, "v": v_w, "o": sd[p + "attn.c_proj.weight"],
            "ffn_norm": sd[p + "ln_2.weight"], "gate": gate, "up": up, "down": sd[p + "mlp.c_proj.weight"]}


def llama_state_dict(model):
    """Our state dict renamed and split into transformers' LlamaForCausalLM names (fp32, CPU)."""
    c = model.config
    ours = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    out = {"model.embed_tokens.weight": ours["transformer.wte.weight"][: c.vocab_size]}  # drop padding rows
    for i in range(c.n_layer):
        q = f"model.layers.{i}."
        out.update({q + HF_NAMES[role]: tensor for role, tensor in llama_block(ours, c, i).items()})
    out["model.norm.weight"] = ours["transformer.ln_f.weight"]
    if not c.tie_embeddings:  # tied: transformers ties lm_head to embed_tokens on load
        out["lm_head.weight"] = ours["lm_head.weight"][: c.vocab_size]
    return {k: v.contiguous() for k, v in out.items()}


def export_llama(model, folder, eos_token_id=None):
    """Write `model` as a Hugging Face LlamaForCausalLM folder (config.json + model.safetensors)."""
    c = model.config
    wrong = llama_mismatches(c)
    if wrong:
        raise UserError("only LLaMA-shaped models export to the LLaMA format: " + ", ".join(wrong))
    hf_config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": c.vocab_size, "hidden_size": c.n_embd, "intermediate_size": c.hidden_size,
        "num_hidden_layers": c.n_layer, "num_attention_heads": c.n_head, "num_key_value_heads": c.kv_heads,
        "head_dim": c.head_dim, "max_position_embeddings": c.block_size, "hidden_act": "silu",
        "rms_norm_eps": NORM_EPS, "rope_theta": c.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta},  # transformers 5's spelling
        "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0,
        "tie_word_embeddings": c.tie_embeddings, "bos_token_id": eos_token_id, "eos_token_id": eos_token_id,
        "torch_dtype": "float32",
    }
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(llama_state_dict(model), folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
