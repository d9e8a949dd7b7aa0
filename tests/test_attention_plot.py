"""attention_plot.py: a valid PNG with one panel per head, holding the model's own weights."""

import sys

import pytest
import torch

from gptkit.evals import attention_plot
from gptkit.ops.errors import UserError
from gptkit.data.tokenizer import Tokenizer
from model import GPT, GPTConfig

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CHARS = list(" abcdefghijklmnopqrstuvwxyz.\n")


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    config = GPTConfig(
        n_layer=2, n_head=3, n_embd=12, block_size=16, vocab_size=len(CHARS), dropout=0.0
    )
    return GPT(config), Tokenizer.from_dict({"type": "char", "chars": CHARS})


@pytest.fixture
def mpl():
    return pytest.importorskip("matplotlib", reason="matplotlib is optional; pip install matplotlib")


def test_draws_a_png_with_one_panel_per_head(tiny, mpl, tmp_path):
    import matplotlib.image

    model, tok = tiny
    path = attention_plot.draw_attention(model, tok, "the cat sat", 1, tmp_path / "attn.png")
    assert path == tmp_path / "attn.png"
    assert path.read_bytes()[:8] == PNG_MAGIC
    pixels = matplotlib.image.imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100


def test_panels_hold_the_models_attention_weights(tiny, mpl):
    model, tok = tiny
    ids = tok.encode("the cat")
    with torch.no_grad():
        maps = model.attention_maps(torch.tensor([ids]), 0)[0]  # (H, T, T)
    assert maps.shape == (3, 7, 7)
    labels = attention_plot.token_labels(tok, ids)
    fig = attention_plot.attention_figure(maps, labels, "layer 0")
    assert len(fig.axes) == 3
    for h, ax in enumerate(fig.axes):
        assert torch.allclose(torch.as_tensor(ax.images[0].get_array()), maps[h])
        assert [t.get_text() for t in ax.get_xticklabels()] == labels
        assert [t.get_text() for t in ax.get_yticklabels()] == labels
        assert ax.get_title() == f"head {h}"


@pytest.mark.parametrize("heads", [1, 4, 5, 12])
def test_grid_has_exactly_one_axes_per_head(mpl, heads):
    maps = torch.softmax(torch.randn(heads, 4, 4), dim=-1)
    fig = attention_plot.attention_figure(maps, list("abcd"), "t")
    assert len(fig.axes) == heads


def test_labels_make_spaces_and_newlines_visible(tiny):
    _, tok = tiny
    assert attention_plot.token_labels(tok, tok.encode("a b\n")) == ["a", "␣", "b", "\\n"]


def test_bpe_labels_are_decoded_tokens(tiktoken_available):
    tok = Tokenizer.from_dict({"type": "gpt2"})
    ids = tok.encode("Hello world")
    assert attention_plot.token_labels(tok, ids) == ["Hello", "␣world"]


def test_long_prompt_is_cut_and_the_title_says_so(tiny, mpl, tmp_path, monkeypatch):
    model, tok = tiny
    seen = {}
    real = attention_plot.attention_figure

    def spy(maps, labels, title):
        seen.update(maps=maps, labels=labels, title=title)
        return real(maps, labels, title)

    monkeypatch.setattr(attention_plot, "attention_figure", spy)
    text = "a long prompt longer than the block"  # 35 chars > block_size 16
    attention_plot.draw_attention(model, tok, text, 0, tmp_path / "a.png", max_tokens=10)
    assert seen["maps"].shape == (3, 10, 10)
    assert "first 10 of 35 tokens" in seen["title"]
    attention_plot.draw_attention(model, tok, text, 0, tmp_path / "b.png")
    assert seen["maps"].shape == (3, 16, 16)  # capped by the block size
    assert "first 16 of 35 tokens" in seen["title"]


def test_model_mode_is_restored(tiny, mpl, tmp_path):
    model, tok = tiny
    model.train()
    attention_plot.draw_attention(model, tok, "ab", 0, tmp_path / "a.png")
    assert model.training
    model.eval()


@pytest.mark.parametrize("layer", [-1, 2])
def test_layer_out_of_range_is_a_user_error(tiny, tmp_path, layer):
    model, tok = tiny
    with pytest.raises(UserError, match=r"layers 0\.\.1"):
        attention_plot.draw_attention(model, tok, "ab", layer, tmp_path / "a.png")


def test_empty_prompt_and_missing_folder_are_user_errors(tiny, mpl, tmp_path):
    model, tok = tiny
    with pytest.raises(UserError, match="empty"):
        attention_plot.draw_attention(model, tok, "", 0, tmp_path / "a.png")
    with pytest.raises(UserError, match="nowhere"):
        attention_plot.draw_attention(model, tok, "ab", 0, tmp_path / "nowhere" / "a.png")


def test_missing_matplotlib_names_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    with pytest.raises(UserError, match="pip install matplotlib"):
        attention_plot.attention_figure(torch.ones(1, 2, 2), ["a", "b"], "t")
