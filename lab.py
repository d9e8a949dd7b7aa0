"""The Transformer chapter's self-attention calculator, run on this project's own
attention code (`model.CausalSelfAttention.qkv` and `model.reference_attention`).

Five words, one head, d = 4, seeded weights. Step through the five stages of
scaled dot-product attention and toggle the causal mask to see the upper
triangle turn from -inf into numbers (mask off is BERT-style bidirectional
attention). Keys are read as lines from stdin, so a pipe can drive it too:

    python lab.py                          # Enter next, m mask, b back, q quit
    python lab.py --text "a b c d e" --no_interactive
    printf '\\n\\nm\\nq\\n' | python lab.py
    python lab.py --scaling                # why the scores are divided by √d_k
    python lab.py params configs/gpt2.py   # where GPT-2's 124M parameters are (gptkit/models/params.py)
"""

import math
import sys
from dataclasses import dataclass

from gptkit.ops.errors import quiet_start

quiet_start()  # a Ctrl-C or a missing package while the imports below load: one line, no traceback
import torch

from gptkit.models import params
from gptkit.ops.errors import ArgumentParser, UserError, run_main
from model import CausalSelfAttention, GPTConfig, reference_attention

DEFAULT_TEXT = "the cat sat on mat"
D_MODEL = 4  # the chapter's toy width: small enough to check by hand
MAX_WORDS = 8  # a T x T matrix of 8 columns still fits an 80-column terminal
PROMPT = "[Enter] next stage | m toggle mask | b back | q quit > "


@dataclass
class Toy:
    """The lab's inputs: the words, their embeddings and a one-head attention layer."""

    words: list
    x: torch.Tensor  # (1, T, C) token embeddings, C = D_MODEL
    attn: CausalSelfAttention


def make_toy(text=DEFAULT_TEXT, seed=0):
    """Seeded embeddings for the words of `text` and a seeded one-head attention."""
    words = text.split()
    if not 1 <= len(words) <= MAX_WORDS:
        raise UserError(
            f"--text needs between 1 and {MAX_WORDS} words separated by spaces, got {len(words)}"
        )
    vocab = sorted(set(words))  # a repeated word gets the same embedding, as in a real model
    gen = torch.Generator().manual_seed(seed)
    table = torch.randn(len(vocab), D_MODEL, generator=gen)  # (V, C)
    ids = torch.tensor([vocab.index(w) for w in words])
    x = table[ids].unsqueeze(0)  # (1, T, C)
    config = GPTConfig(
        n_embd=D_MODEL, n_head=1, block_size=len(words), vocab_size=len(vocab), bias=False
    )
    # Seed the layer's init without disturbing the caller's global RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        attn = CausalSelfAttention(config)
    attn.eval()
    return Toy(words=words, x=x, attn=attn)


def compute_stages(toy, causal=True):
    """Every intermediate matrix of one head, as 2-D tensors (T, D) or (T, T)."""
    with torch.no_grad():
        q, k, v = toy.attn.qkv(toy.x)  # each (1, 1, T, D)
        _, stages = reference_attention(q, k, v, causal=causal, return_stages=True)
    out = {"x": toy.x[0], "q": q[0, 0], "k": k[0, 0], "v": v[0, 0]}
    for name in ("scores", "scaled", "weights", "output"):
        out[name] = stages[name][0, 0]  # (T, T), or (T, D) for the output
    return out


def format_matrix(m, row_labels, col_labels, width=7):
    """A matrix as text with labelled rows and columns; -inf printed as such."""
    label_w = max(len(s) for s in row_labels)
    head = " " * label_w + " " + "".join(f"{c[:width - 1]:>{width}}" for c in col_labels)
    lines = [head]
    for label, row in zip(row_labels, m.tolist()):
        cells = "".join(
            f"{'-inf':>{width}}" if v == float("-inf") else f"{v:{width}.2f}" for v in row
        )
        lines.append(f"{label:>{label_w}} {cells}")
    return "\n".join(lines)


STAGE_TITLES = [
    "Q/K/V projections",
    "scores Q·Kᵀ",
    "scaled and masked scores",
    "softmax weights",
    "weighted sum of V",
]


def render_stage(index, stages, words, causal):
    """The text of stage `index` (0..4): title, formula, matrices, and what to notice."""
    T, D = stages["q"].shape
    dims = [f"d{i}" for i in range(D)]
    mask = "causal mask ON" if causal else "causal mask OFF (bidirectional, like BERT)"
    lines = [f"── stage {index + 1}/5 · {STAGE_TITLES[index]} · {mask} ──"]
    if index == 0:
        lines.append(
            "Q = X·W_q   K = X·W_k   V = X·W_v   (X: one row per word, d=4; "
            "W_q, W_k, W_v are the three thirds of c_attn's weight)"
        )
        for name in ("x", "q", "k", "v"):
            lines += ["", f"{name.upper()}:", format_matrix(stages[name], words, dims)]
        lines.append("\nThe mask plays no part yet: it enters at stage 3.")
    elif index == 1:
        lines.append("S = Q·Kᵀ   S[i, j] = how well word i's query matches word j's key")
        lines += ["", format_matrix(stages["scores"], words, words)]
        lines.append("\nThe mask plays no part yet: it enters at stage 3.")
    elif index == 2:
        formula = f"S / √d_k   (d_k = {D}, so divide by {math.sqrt(D):.2f})"
        if causal:
            formula += ", then -inf above the diagonal: word i may not look at later words"
        else:
            formula += "; no mask, so every word sees every word"
        lines += [formula, "", format_matrix(stages["scaled"], words, words)]
    elif index == 3:
        lines.append("A = softmax(each row)   A[i, j] = exp(s_ij) / Σ_j' exp(s_ij')")
        weights = stages["weights"]
        lines += ["", format_matrix(weights, words, words)]
        sums = ", ".join(f"{s:.2f}" for s in weights.sum(-1).tolist())
        lines.append(f"\nrow sums: {sums} (a softmax row always sums to 1)")
        if causal:
            lines.append(
                f"Row 1 is [1, 0, ..., 0]: '{words[0]}' can only attend to itself, and the "
                "softmax of a single finite score (the rest are exp(-inf) = 0) is 1.00."
            )
        else:
            lines.append(
                "Mask off: the upper triangle now holds weights, and each row is reshuffled "
                "because the later words take a share of it."
            )
    else:
        lines.append("O = A·V   each word's output is its weighted average of the value rows")
        lines += ["", format_matrix(stages["output"], words, dims)]
        lines.append("\n(the model then mixes the heads with c_proj, the output projection)")
    return "\n".join(lines)


def walk(toy, keys, write=print):
    """The interactive loop: `keys` yields one command per line ('' = Enter)."""
    stages = {c: compute_stages(toy, causal=c) for c in (True, False)}
    stage, causal = 0, True
    write(render_stage(stage, stages[causal], toy.words, causal))
    for key in keys:
        if key == "q":
            return
        if key == "":
            if stage == len(STAGE_TITLES) - 1:
                write("That was the last stage.")
                return
            stage += 1
        elif key == "b":
            stage = max(stage - 1, 0)
        elif key == "m":
            causal = not causal
            write(f"causal mask {'ON' if causal else 'OFF'} (it changes stages 3, 4 and 5)")
        else:
            write(f"unknown key {key!r}: press Enter, m, b or q")
            continue
        write(render_stage(stage, stages[causal], toy.words, causal))


def _stdin_keys():
    """Commands from stdin, one per line, until EOF."""
    while True:
        print(PROMPT, end="", flush=True)
        line = sys.stdin.readline()
        if not line:
            print()
            return
        yield line.strip().lower()


def print_all(toy, write=print):
    """Every stage with the mask on, then with it off (for scripts and tests)."""
    for causal in (True, False):
        stages = compute_stages(toy, causal=causal)
        for index in range(len(STAGE_TITLES)):
            write(render_stage(index, stages, toy.words, causal))
            write("")


# ---- the √d_k effect ------------------------------------------------------------------


def scaling_stats(d_k, samples=4096, T=16, seed=0):
    """How big raw dot products get for width d_k, and what that does to the softmax.

    q and k have independent N(0, 1) entries, so q·k is a sum of d_k products of
    variance 1: Var(q·k) = d_k ("Attention Is All You Need", Vaswani et al. 2017,
    section 3.2.1, footnote 4). Scaling by 1/√d_k brings the variance back to 1.
    Without it, one score per row dominates and the softmax saturates (max weight
    near 1, entropy near 0), which starves the other positions of gradient.
    """
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(samples, 1, T, d_k, generator=gen)  # (B, H, T, D)
    k = torch.randn(samples, 1, T, d_k, generator=gen)  # (B, H, T, D)
    with torch.no_grad():
        _, stages = reference_attention(q, k, k, causal=False, return_stages=True)
    raw = stages["scores"]  # (B, H, T, T)
    scaled = raw / math.sqrt(d_k)
    # The diagonal pairs q_i with k_i: distinct vectors for every i and b, so these
    # B*T scores are independent (those in one row share q and are not).
    diag = torch.diagonal(raw, dim1=-2, dim2=-1).flatten()  # (B*T,)
    weights = {"raw": torch.softmax(raw, dim=-1), "scaled": stages["weights"]}

    def entropy(w):  # in nats; a uniform row over T keys has log T
        return -torch.special.xlogy(w, w).sum(-1).mean().item()

    out = {
        "d_k": d_k,
        "n": diag.numel(),
        "var_raw": diag.var().item(),
        "std_raw": diag.std().item(),
        "std_scaled": (diag / math.sqrt(d_k)).std().item(),
        "T": T,
    }
    for name, w in weights.items():
        top = w.max(dim=-1).values  # (B, H, T)
        out[f"max_weight_{name}"] = top.mean().item()
        out[f"saturated_{name}"] = (top > 0.99).float().mean().item()
        out[f"entropy_{name}"] = entropy(w)
    assert torch.allclose(stages["scaled"], scaled), "reference_attention scaled differently"
    return out


def scaling_report(dims=(4, 64, 128), samples=4096, T=16, seed=0):
    """The √d_k table as text."""
    rows = [scaling_stats(d, samples=samples, T=T, seed=seed) for d in dims]
    lines = [
        f"Raw dot products q·k of random unit-variance vectors, and softmax over T={T} keys",
        f"({rows[0]['n']:,} independent scores per d_k; entropy of a uniform row = log {T} "
        f"= {math.log(T):.2f} nats)",
        "",
        f"{'d_k':>5} {'√d_k':>6} {'std q·k':>8} {'std /√d_k':>10} | "
        f"{'max weight':>10} {'rows >0.99':>10} {'entropy':>8} | "
        f"{'max weight':>10} {'rows >0.99':>10} {'entropy':>8}",
        f"{'':>33}| {'without scaling':^30} | {'with 1/√d_k':^30}",
    ]
    for r in rows:
        lines.append(
            f"{r['d_k']:>5} {math.sqrt(r['d_k']):>6.2f} {r['std_raw']:>8.2f} {r['std_scaled']:>10.2f} | "
            f"{r['max_weight_raw']:>10.2f} {r['saturated_raw']:>10.1%} {r['entropy_raw']:>8.2f} | "
            f"{r['max_weight_scaled']:>10.2f} {r['saturated_scaled']:>10.1%} {r['entropy_scaled']:>8.2f}"
        )
    lines += [
        "",
        "Theory: Var(q·k) = d_k, so std = √d_k (Vaswani et al. 2017, footnote 4). Unscaled, the",
        "softmax grows peakier as d_k grows (a near one-hot row passes almost no gradient to",
        "the other keys); divided by √d_k, every width sees scores of std 1 and the same softmax.",
    ]
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["params"]:  # a sub-command with nanoGPT-style settings of its own
        rest = argv[1:]
        print(params.usage() if "-h" in rest or "--help" in rest else params.report_from_argv(rest))
        return 0
    parser = ArgumentParser(
        prog="lab.py", description="Step through self-attention on five words (d=4).",
        epilog="python lab.py params CONFIG.py [--key=value ...]: parameter counts per component "
        "(python lab.py params --help)",
    )
    parser.add_argument("--text", default=DEFAULT_TEXT, help="the words (default: %(default)r)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the embeddings and weights")
    parser.add_argument(  # the hyphen spelling is the older one, kept for scripts
        "--no_interactive", "--no-interactive", action="store_true", help="print every stage, mask on and off"
    )
    parser.add_argument(
        "--scaling", action="store_true", help="show the √d_k effect for d_k = 4, 64, 128"
    )
    parser.add_argument("--samples", type=int, default=4096, help="rows sampled for --scaling")
    args = parser.parse_args(argv)
    if not 0 <= args.seed < 2**63:  # torch's generators take a 64-bit seed
        raise UserError(f"--seed must be between 0 and 2**63 - 1, got {args.seed}")
    if args.scaling:
        if args.samples < 1:
            raise UserError(f"--samples must be at least 1, got {args.samples}")
        print(scaling_report(samples=args.samples, seed=args.seed))
        return 0
    toy = make_toy(args.text, seed=args.seed)
    if args.no_interactive:
        print_all(toy)
    else:
        walk(toy, _stdin_keys())
    return 0


if __name__ == "__main__":
    run_main(main)
