"""train.py on a chat dataset: the loss of the assistant's tokens only, exact over the global
batch (checked against the mean by hand), learnt where a plain-text loss could not be,
resumed exactly, and from a trained model whose vocabulary grows by the turn tokens."""

import contextlib
import dataclasses
import json
import random
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from train_helpers import losses_by_iter, read_metrics, tiny_args

import train
from gptkit.data.chat_batches import ChatBatches
from gptkit.train.distributed import Dist
from gptkit.ops.checkpoint import load_checkpoint
from gptkit.data.dataset import load_meta
from gptkit.prepare.chat import prepare_chat
from model import GPT, GPTConfig

REPLY = "I hear you."


def noisy_conversations(n, seed=0):
    """User turns of random letters, and always the same assistant reply."""
    r = random.Random(seed)
    for _ in range(n):
        noise = "".join(r.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(r.randint(5, 20)))
        yield {"messages": [{"role": "user", "content": noise}, {"role": "assistant", "content": REPLY}]}


@pytest.fixture
def chat_data(tmp_path):
    path = tmp_path / "noise.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in noisy_conversations(200)))
    prepare_chat([path], "char", "noise", tmp_path / "data", progress=False)
    return tmp_path / "data"


def chat_args(data_dir, out_dir, **overrides):
    settings = dict(dataset="noise", block_size=48, batch_size=8, dropout=0.0, learning_rate=3e-3, n_embd=48,
                    eval_iters=0, min_lr=3e-4, max_iters=20, lr_decay_iters=60)
    return tiny_args(data_dir, out_dir, **(settings | overrides))


def by_hand(model, x, y):
    """The mean over every target (y >= 0) of -log p(target): log-softmax written out, token by token."""
    logits = model(x)[0]  # (B, T, V)
    losses = []
    for b in range(x.shape[0]):
        for t in range(x.shape[1]):
            if y[b, t] >= 0:
                row = logits[b, t].double()
                losses.append((row.exp().sum().log() - row[y[b, t]]).item())
    return sum(losses) / len(losses)


class Capture(torch.optim.SGD):
    """An optimizer whose step only keeps the gradients it is given."""

    def step(self, closure=None):
        self.grads = [p.grad.clone() for g in self.param_groups for p in g["params"]]


def test_the_step_loss_and_gradient_are_the_global_target_mean_not_a_mean_of_means(chat_data):
    """train.py's train_step itself, on a chat reader: the same step text as for a text."""
    meta = load_meta(chat_data, "noise")
    batches = ChatBatches(chat_data, "noise", meta, 48, "cpu", batch_size=3, accumulation=4, seed=5)
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=48, vocab_size=meta["vocab_size"]))
    opt = Capture(model.parameters(), lr=0.0)
    opt.param_groups[0]["base_lr"] = 0.0
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    step = train.Step(train.Forward(model, False), model, [opt], scaler, batches, contextlib.nullcontext(),
                      Dist(), grad_clip=0.0)
    loss, _, _ = train.train_step(step, 7, 1.0, SimpleNamespace(raised=False))
    micro = list(batches.micro_batches(7))
    x = torch.cat([x for x, _ in micro])
    y = torch.cat([y for _, y in micro])
    counts = [(y_ >= 0).sum().item() for _, y_ in micro]
    assert len(set(counts)) > 1  # micro-batches of different target counts: a mean of means would differ
    assert batches.targets(7) == sum(counts)
    F.cross_entropy(model(x)[0].flatten(0, 1), y.flatten(), ignore_index=-1, reduction="sum").div(sum(counts)).backward()
    assert all(torch.allclose(a, p.grad, atol=1e-6) for a, p in zip(opt.grads, model.parameters()))
    with torch.no_grad():
        assert loss == pytest.approx(by_hand(model, x, y), abs=1e-5)


def test_noise_with_a_constant_reply_learns_the_reply_to_near_zero_loss(chat_data, tmp_path):
    out = tmp_path / "out"
    assert train.main(chat_args(chat_data, out, max_iters=60, eval_interval=60, learning_rate=1e-2, lr_decay_iters=60)) == 0
    val = read_metrics(out, "eval")[-1]["val_loss"]
    assert val < 0.05, val
    # the figure is the mean over the val split's targets by hand, read from the trained weights
    ckpt = load_checkpoint(out / "ckpt.pt")
    model = GPT(GPTConfig(**ckpt["model_config"]))
    model.load_state_dict(ckpt["model"])
    model.eval()
    batches = ChatBatches(chat_data, "noise", load_meta(chat_data, "noise"), 48, "cpu")
    with torch.no_grad():
        x, y = batches.get("val", range(batches.n_windows("val")))
        assert by_hand(model, x, y) == pytest.approx(val, abs=1e-5)
        every = batches.first["val"][0]  # a plain-text loss over every token could not go near zero: noise
        plain = F.cross_entropy(model(every[:, :-1])[0].flatten(0, 1), every[:, 1:].flatten()).item()
    assert plain > 1.0


def test_resumed_chat_run_equals_uninterrupted(chat_data, tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    assert train.main(chat_args(chat_data, full, max_iters=20, dropout=0.1)) == 0
    assert train.main(chat_args(chat_data, part, max_iters=10, dropout=0.1)) == 0
    assert train.main(chat_args(chat_data, part, max_iters=20, dropout=0.1, init_from="resume")) == 0
    a, b = losses_by_iter(full), losses_by_iter(part)
    assert sorted(a) == sorted(b) == list(range(20)) and all(abs(a[i] - b[i]) <= 1e-6 for i in a)
    assert [e["val_loss"] for e in read_metrics(full, "eval")] == pytest.approx([e["val_loss"] for e in read_metrics(part, "eval")], abs=1e-6)


@pytest.mark.parametrize("tie", [True, False])
def test_grown_vocabulary_keeps_old_rows_and_starts_new_ones_at_the_mean(tie):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=10, tie_embeddings=tie))
    before = model.transformer.wte.weight.detach().clone()
    model.grow_vocab(14)
    wte = model.transformer.wte.weight
    assert wte.shape[0] >= 14 and model.config.vocab_size == 14
    assert torch.equal(wte[:10], before[:10]) and torch.allclose(wte[10:14], before[:10].mean(0).expand(4, -1))
    assert (model.lm_head.weight is wte) == tie
    assert model(torch.tensor([[1, 12, 13]]))[0].shape == (1, 3, 14)


def test_fine_tuning_one_of_our_checkpoints_grows_it_by_the_turn_tokens(chat_data, tmp_path):
    """A char model trained on text of the same characters, then fine-tuned on the chat set."""
    meta = load_meta(chat_data, "noise")
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=48, block_size=48, vocab_size=meta["vocab_size"] - 4)
    base = GPT(cfg)
    from gptkit.ops.checkpoint import save_checkpoint

    save_checkpoint({"format_version": 1, "model": base.state_dict(), "model_config": dataclasses.asdict(cfg),
                     "tokenizer": meta["tokenizer"], "config": {}}, tmp_path / "base.pt")
    out = tmp_path / "ft"
    assert train.main(chat_args(chat_data, out, init_from=str(tmp_path / "base.pt"), max_iters=4)) == 0
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert ckpt["model_config"]["vocab_size"] == meta["vocab_size"] and ckpt["chat"]["turn_ids"] == meta["chat"]["turn_ids"]
    assert ckpt["model"]["transformer.wte.weight"].shape[0] >= meta["vocab_size"]
    # LoRA on the chat-trained checkpoint: its turn tokens exist now, only adapters train
    lora_out = tmp_path / "lora"
    assert train.main(chat_args(chat_data, lora_out, init_from=str(out / "ckpt.pt"), max_iters=2, lora_rank=2)) == 0
    assert load_checkpoint(lora_out / "ckpt.pt")["lora"]["rank"] == 2


def test_a_hugging_face_gpt2_folder_grows_by_the_turn_tokens_with_or_without_lora(tmp_path, tiktoken_available):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=64)).save_pretrained(tmp_path / "hf")
    path = tmp_path / "noise.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in noisy_conversations(40)))
    prepare_chat([path], "gpt2", "noise", tmp_path / "data", progress=False)
    args = dict(init_from=str(tmp_path / "hf"), max_iters=2, n_layer=1, n_embd=16, block_size=32, batch_size=2)
    assert train.main(chat_args(tmp_path / "data", tmp_path / "out", **args)) == 0
    ckpt = load_checkpoint(tmp_path / "out" / "ckpt.pt")
    assert ckpt["model_config"]["vocab_size"] == 50261 and ckpt["model"]["lm_head.weight"].shape[0] >= 50261
    # LoRA: the adapters and the grown token embedding train (the new rows must learn), and are saved;
    # resumed, the run goes on exactly; loaded for sampling, the base grows again and takes them
    full, part = tmp_path / "lora", tmp_path / "lora-part"
    lora_args = dict(args, max_iters=4, lora_rank=2, eval_interval=2, lr_decay_iters=4)
    assert train.main(chat_args(tmp_path / "data", full, **lora_args)) == 0
    assert train.main(chat_args(tmp_path / "data", part, **dict(lora_args, max_iters=2))) == 0
    assert train.main(chat_args(tmp_path / "data", part, **dict(lora_args, init_from="resume"))) == 0
    a, b = losses_by_iter(full), losses_by_iter(part)
    assert sorted(a) == sorted(b) == list(range(4)) and all(abs(a[i] - b[i]) <= 1e-6 for i in a)
    ckpt = load_checkpoint(full / "ckpt.pt")
    assert ckpt["lora"]["trained"] == ["transformer.wte.weight", "lm_head.weight"] and ckpt["lora"]["vocab_size"] == 50261
    assert ckpt["model"]["transformer.wte.weight"].shape[0] == 50261 and not any("c_fc" in k for k in ckpt["model"])
    from transformers import GPT2LMHeadModel as HF

    base_rows = HF.from_pretrained(tmp_path / "hf").transformer.wte.weight.detach()
    new_rows = ckpt["model"]["transformer.wte.weight"][50257:]
    assert not torch.allclose(new_rows, base_rows.mean(0).expand(4, -1))  # the turn tokens' rows trained
    from gptkit.models.loading import load_model

    model, tokenizer, _ = load_model(ckpt=str(full / "ckpt.pt"))
    assert model.config.vocab_size == 50261 and torch.equal(model.transformer.wte.weight[50257:], new_rows)


def test_two_gloo_ranks_equal_one_process_on_chat_data(chat_data, tmp_path):
    """Ranks hold micro-batches of different target counts: the exact global mean still
    comes out the same as one process's (dropout 0, as for text)."""
    from train_helpers import run_torchrun

    args = dict(max_iters=6, eval_interval=3, gradient_accumulation_steps=4)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert train.main(chat_args(chat_data, tmp_path / "one", **args)) == 0
    finally:
        torch.set_num_threads(threads)
    result = run_torchrun(chat_args(chat_data, tmp_path / "two", **args), cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    a, b = losses_by_iter(tmp_path / "one"), losses_by_iter(tmp_path / "two")
    assert sorted(a) == sorted(b) == list(range(6)) and max(abs(a[i] - b[i]) for i in a) < 1e-5, (a, b)
    va = [e["val_loss"] for e in read_metrics(tmp_path / "one", "eval")]
    assert va == pytest.approx([e["val_loss"] for e in read_metrics(tmp_path / "two", "eval")], abs=1e-5)


def test_a_chat_split_shorter_than_one_window_still_trains(tmp_path):
    """Conversations are padded into whole windows: a val split of one short conversation is enough."""
    path = tmp_path / "few.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in noisy_conversations(4)))
    prepare_chat([path], "char", "noise", tmp_path / "data", val_fraction=0.25, progress=False)
    assert load_meta(tmp_path / "data", "noise")["num_tokens"]["val"] < 49
    assert train.main(chat_args(tmp_path / "data", tmp_path / "out", max_iters=2, eval_interval=2)) == 0


def test_three_fsdp_ranks_equal_one_process_on_chat_data(chat_data, tmp_path):
    """FSDP's forward passes are collectives: the chat evaluation's batches, which do not
    divide among 3 ranks, still finish, with one process's losses."""
    from train_helpers import run_torchrun

    args = dict(max_iters=3, eval_interval=3, gradient_accumulation_steps=3)
    assert train.main(chat_args(chat_data, tmp_path / "one", **args)) == 0
    result = run_torchrun(chat_args(chat_data, tmp_path / "fsdp", parallel="fsdp", **args), nproc=3, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    a, b = losses_by_iter(tmp_path / "one"), losses_by_iter(tmp_path / "fsdp")
    assert sorted(a) == sorted(b) == list(range(3)) and max(abs(a[i] - b[i]) for i in a) < 1e-5, (a, b)
    va = [e["val_loss"] for e in read_metrics(tmp_path / "one", "eval")]
    assert va == pytest.approx([e["val_loss"] for e in read_metrics(tmp_path / "fsdp", "eval")], abs=1e-5)
