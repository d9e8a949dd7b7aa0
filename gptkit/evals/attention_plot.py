"""Attention maps: the softmax weights of every head of one layer, as a grid of heatmaps.

Row i of a panel is what token i looks at; the tokens label both axes. Heads
that attend to the previous token show up as a bright line just below the
diagonal, heads that look back to the first token as a bright first column.
Called by `sample.py`:

    python sample.py --out_dir out-shakespeare-char --start "ROMEO:" --attention attn.png --layer 2

matplotlib is optional for the project and imported only here, lazily, with the
Agg backend (no display needed).
"""

import io
import math
from pathlib import Path

import torch

from gptkit.ops.checkpoint import write_text_atomic
from gptkit.ops.errors import UserError

MAX_TOKENS = 48  # past ~50 labels per axis the tick labels overlap and the cells vanish


def _figure_class():
    """matplotlib's Figure, rendered with Agg; a UserError naming the fix when missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib.figure import Figure
    except ImportError:
        raise UserError("drawing attention maps needs matplotlib: pip install matplotlib")
    return Figure


def token_labels(tokenizer, ids):
    """One short, visible label per token: spaces as '␣', newlines as '\\n'."""
    labels = []
    for i in ids:
        text = tokenizer.decode([i])
        labels.append(text.replace(" ", "␣").replace("\n", "\\n").replace("\t", "\\t") or "∅")
    return labels


def attention_figure(maps, labels, title):
    """A Figure with one heatmap per head of `maps` (H, T, T), tokens on both axes.

    The grid has exactly H axes (empty grid cells are not created), so
    `len(fig.axes)` is the number of heads.
    """
    H, T, _ = maps.shape
    Figure = _figure_class()
    cols = math.ceil(math.sqrt(H))
    rows = math.ceil(H / cols)
    cell = max(2.5, 0.18 * T)  # inches per panel: room for T tick labels
    fig = Figure(figsize=(cols * cell + 0.5, rows * cell + 0.9), layout="constrained")
    fontsize = 8 if T <= 24 else 6
    for h in range(H):
        ax = fig.add_subplot(rows, cols, h + 1)
        ax.imshow(maps[h].numpy(), cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
        ax.set_title(f"head {h}", fontsize=9)
        ax.set_xticks(range(T), labels, rotation=90, fontsize=fontsize)
        ax.set_yticks(range(T), labels, fontsize=fontsize)
        ax.set_xlabel("attends to (key)", fontsize=8)
        if h % cols == 0:
            ax.set_ylabel("token (query)", fontsize=8)
    fig.suptitle(title, fontsize=10)
    return fig


def draw_attention(model, tokenizer, text, layer, path, max_tokens=MAX_TOKENS):
    """Draw layer `layer`'s attention weights for `text`, one panel per head; return the PNG's Path.

    Long prompts are cut to their first tokens (at most `max_tokens` and the
    model's block size); the title says so. With causal attention the maps of
    the first N tokens do not depend on anything after them, so the cut changes
    nothing that is shown.
    """
    n_layer = model.config.n_layer
    if not 0 <= layer < n_layer:
        raise UserError(f"--layer {layer} is out of range: this model has layers 0..{n_layer - 1}")
    ids = tokenizer.encode(text)
    if not ids:
        raise UserError("the prompt is empty: give some text with --start to draw attention over")
    limit = min(max_tokens, model.config.block_size)
    shown = ids[:limit]
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            idx = torch.tensor([shown], dtype=torch.long, device=device)  # (1, T)
            maps = model.attention_maps(idx, layer)[0].float().cpu()  # (H, T, T)
    finally:
        model.train(was_training)
    title = f"layer {layer}: attention weights of {maps.shape[0]} heads (colour 0 → 1)"
    if len(shown) < len(ids):
        title += f"\nshowing the first {len(shown)} of {len(ids)} tokens"
    fig = attention_figure(maps, token_labels(tokenizer, shown), title)
    path = Path(path)
    if not path.parent.is_dir():
        raise UserError(f"cannot write {path}: the folder {path.parent} does not exist")
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    write_text_atomic(path, png.getvalue())  # a full disk leaves the previous picture, not half a PNG
    return path
