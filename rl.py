"""Past supervised fine-tuning: reinforcement learning on verifiable rewards (a simplified
GRPO, as nanochat's scripts/chat_rl.py) or DPO on preference pairs, from a chat checkpoint.

    python rl.py configs/rl_arithmetic.py                        # GRPO on sums, offline, CPU
    python rl.py configs/rl_arithmetic.py --init_from=resume     # continue out_dir/ckpt.pt
    python rl.py configs/rl_dpo_arithmetic.py                    # DPO on right vs wrong sums
    torchrun --standalone --nproc_per_node=2 rl.py configs/rl_arithmetic.py

GRPO: every step takes prompts_per_step prompts; for each, the model samples
group_size replies (gptkit/generation/generate.py, model.py's KV cache), a reward function scores
them (gptkit/data/rl_data.py), and `grpo_step` raises the log-probability of the reply
tokens of replies better than their group's mean and lowers the others'. DPO: every
step takes pairs_per_step pairs and `dpo_step` raises the chosen reply's log-probability
ratio to a frozen reference (the starting checkpoint; with LoRA the base itself, its
adapters switched off) above the rejected one's. Every eval_interval steps: pass@1 of
greedy replies (temperature 0) to held-out prompts and the mean reward of sampled ones
(and, for DPO, the held-out pairs' reward margin). Logs, checkpoints, SIGINT/SIGTERM
and torchrun behave as train.py's (docs/rl.md).
"""

import dataclasses
import json
import math
import random
import time
from pathlib import Path

from gptkit.ops.errors import quiet_start

quiet_start()
import torch
import torch.nn.functional as F

from gptkit.models import lora
from gptkit.data import rl_data
from gptkit.ops.checkpoint import load_checkpoint, write_text_atomic
from gptkit.data.chat import chat_vocabulary, prompt_ids, turn_ids
from gptkit.config import parse_settings, setting, settings_dict, choice_problems
from gptkit.ops.device import resolve_device
from gptkit.ops.errors import UserError, run_main, same_on_every_rank
from gptkit.generation.generate import generate_stream, turn_marker
from gptkit.models.loading import adapted_model, checkpoint_of, model_from_checkpoint, read_checkpoint
from gptkit.run_state import provenance, set_rng_state
from gptkit.train import distributed, logger, optim, settings
from gptkit.train.checkpointer import Checkpointer
from gptkit.train.out_dir import OutDir
from gptkit.train.step import clip_gradients, set_lr


@dataclasses.dataclass
class RLConfig:
    """GRPO or DPO from a chat checkpoint (each choice and its source: docs/rl.md)"""

    method: str = setting("grpo", "grpo (sampled replies, rewards) | dpo (preference pairs)")
    init_from: str = setting("out-chat-arithmetic", "the chat checkpoint (a file or run folder) | resume")
    out_dir: str = setting("out-rl", "folder for ckpt.pt, best.pt, config.json, metrics.jsonl")
    overwrite: bool = setting(False, "replace a run already in out_dir")
    # prompts with answers: GRPO's training prompts, and every evaluation's
    task: str = setting("arithmetic", "arithmetic | multiply | gsm8k (reward=final_number) | a .jsonl")
    eval_task: str | None = setting(None, "held-out prompts .jsonl (none: the task's held-out split)")
    reward: str = setting("exact", "exact (the reply is the answer) | final_number (GSM8K's rule)")
    eval_prompts: int = setting(200, "held-out prompts each evaluation answers")
    too_long: str = setting("refuse", "a prompt or pair past the model's block: refuse | crop")
    # GRPO: each choice with where it comes from
    group_size: int = setting(16, "replies sampled per prompt (nanochat: 16; DeepSeekMath: 64)")
    prompts_per_step: int = setting(8, "prompts per step, shared among the ranks")
    temperature: float = setting(1.0, "sampling temperature of the groups (nanochat: 1.0)")
    top_k: int | None = setting(None, "sample among the k likeliest tokens (nanochat: 50); none: all")
    max_new_tokens: int = setting(16, "longest reply sampled")
    advantage: str = setting("mean", "mean: reward - group mean (nanochat) | zscore: / std too")
    loss_norm: str = setting("token", "token: per reply token (nanochat, DAPO) | sequence (GRPO)")
    kl_coef: float = setting(0.0, "weight of the k3 KL term to the reference (DeepSeekMath: 0.04)")
    updates_per_batch: int = setting(1, "optimizer steps per sampled batch: 1 = on-policy, more: PPO")
    clip_eps: float = setting(0.2, "PPO's clip range of the ratio (updates_per_batch > 1)")
    # DPO
    pairs: str = setting("arithmetic", "DPO's pairs: arithmetic (right vs wrong sums) | a .jsonl")
    eval_pairs: str | None = setting(None, "held-out pairs .jsonl (none: arithmetic's, or the pairs)")
    pairs_per_step: int = setting(32, "pairs per step, shared among the ranks")
    beta: float = setting(0.1, "DPO's beta, the strength of the reference (DPO paper, TRL: 0.1)")
    label_smoothing: float = setting(0.0, "chance a pair's label is flipped, eps (TRL's name)")
    dpo_loss: str = setting("sigmoid", "sigmoid: DPO, cDPO with eps | robust: rDPO (TRL's robust)")
    # optimisation (gptkit/train/optim.py's AdamW or Muon)
    optimizer: str = setting("adamw", "adamw | muon")
    learning_rate: float = setting(1e-4, "peak AdamW rate")
    lr_decay: bool = setting(True, "fall linearly to 0 at max_iters (nanochat's chat_rl.py)")
    weight_decay: float = setting(0.0, "AdamW weight decay on matrices (nanochat: 0)")
    beta1: float = setting(0.9, "AdamW beta1")
    beta2: float = setting(0.95, "AdamW beta2")
    grad_clip: float = setting(1.0, "clip the gradient norm; 0 = no clipping")
    muon_lr: float = setting(0.02, "peak Muon rate (optimizer=muon)")
    muon_momentum: float = setting(0.95, "Muon momentum")
    muon_nesterov: bool = setting(True, "Nesterov momentum in Muon")
    max_iters: int = setting(100, "steps")
    batch_size: int = setting(64, "sequences per forward/backward (a step's are split into these)")
    # LoRA (docs/lora.md)
    lora_rank: int = setting(0, "train LoRA adapters of this rank on a frozen base; 0 = every weight")
    lora_alpha: float | None = setting(None, "LoRA scale is alpha / rank; none = the rank")
    lora_dropout: float = setting(0.0, "dropout on each adapter's input")
    lora_targets: str = setting("attn.c_attn", "attn.c_attn | attn.c_proj | mlp.c_fc | mlp.c_proj | all")
    # evaluation, logging
    eval_interval: int = setting(10, "evaluate and save ckpt.pt every this many steps")
    log_interval: int = setting(1, "log a step every this many")
    wandb_log: bool = setting(False, "also log to Weights & Biases")
    wandb_project: str | None = setting(None, "wandb project (none: rl)")
    wandb_run_name: str | None = setting(None, "wandb run name (none: the out_dir's name)")
    progress_bar: bool = setting(False, "a tqdm bar on a terminal")
    # system
    device: str = setting("auto", "auto | cpu | cuda | cuda:N | mps")
    backend: str = setting("auto", "torchrun's backend: auto | nccl | gloo")
    seed: int = setting(1337, "random seed (prompts, samples)")

    def __post_init__(self):
        problems = choice_problems(self, {"method": ("grpo", "dpo"),
                                          "reward": tuple(rl_data.REWARDS),
                                          "too_long": ("refuse", "crop"),
                                          "advantage": ("mean", "zscore"),
                                          "loss_norm": ("token", "sequence"),
                                          "dpo_loss": ("sigmoid", "robust"),
                                          "optimizer": ("adamw", "muon")})
        for name in ("group_size", "prompts_per_step", "pairs_per_step", "max_new_tokens",
                     "updates_per_batch", "max_iters", "batch_size", "eval_interval",
                     "log_interval", "eval_prompts"):
            if getattr(self, name) < 1:
                problems.append(f"{name}={getattr(self, name)} must be at least 1")
        if self.method == "grpo" and self.group_size < 2:
            problems.append("group_size must be at least 2: a group of one has no relative "
                            "advantage")
        if not 0 < self.temperature < math.inf:  # NaN too
            problems.append(f"temperature={self.temperature} must be a number > 0 to sample a group")
        if self.top_k is not None and self.top_k < 1:
            problems.append(f"top_k={self.top_k} must be at least 1 (or none: every token)")
        if not 0 <= self.label_smoothing < 0.5:
            problems.append(f"label_smoothing={self.label_smoothing} must be in [0, 0.5)")
        if not (0 < self.beta < math.inf and 0 <= self.kl_coef < math.inf and 0 < self.clip_eps < math.inf):
            problems.append("beta and clip_eps must be numbers > 0, kl_coef >= 0")
        if self.task not in ("arithmetic", "multiply", "gsm8k") and self.eval_task is None:
            problems.append(f"task={self.task} needs --eval_task, a .jsonl of held-out prompts")
        if self.init_from == "auto":
            problems.append("init_from=auto is train.py's: name the checkpoint, or resume")
        # the optimizer's, the seed's and LoRA's settings by train.py's own rules
        problems += settings.trainer_problems(self)
        if problems:
            raise ValueError("; ".join(problems))


@dataclasses.dataclass
class RLState:
    """The loop's state, saved in every checkpoint (as train.py's RunState)."""

    iter_num: int = 0
    best_pass1: float = -1.0
    pass1: float = math.nan  # at the latest evaluation
    last_eval_iter: int = -1
    train_time_s: float = 0.0
    train_cpu_s: float = 0.0


@dataclasses.dataclass
class Schedule:
    """rl.py's schedule: max_iters steps, the rate falling linearly to 0 (lr_decay, as
    nanochat's chat_rl.py) or constant. The logger reads total_iters and eta_s."""

    max_iters: int
    decay: bool

    @property
    def total_iters(self):
        return self.max_iters

    def lr_scale(self, it):
        return 1 - it / self.max_iters if self.decay else 1.0

    def eta_s(self, state, seconds_per_iter):
        steps_left = max(0, self.max_iters - state.iter_num - 1)
        return None if seconds_per_iter is None else seconds_per_iter * steps_left


@dataclasses.dataclass
class Step:
    """What every update works on, set up once by `run` (as train.py's Step)."""

    model: torch.nn.Module  # the policy (with LoRA: the frozen base and its adapters)
    chat: "Chat"  # its tokens: prompts in the chat template, replies back as text
    optimizers: list  # [AdamW] or [AdamW, Muon]
    params: list  # the trained parameters, whose gradients the ranks sum
    reference: object  # log-probs of reply tokens under the frozen start; None if unused
    reward: object  # reward(reply text, answer) -> 1.0 right, 0.0 wrong (gptkit/rl_data.py)
    dist: distributed.Dist  # this rank, and how many there are
    device: str


@dataclasses.dataclass
class Data:
    """What a run reads, every item loaded and checked before anything is written."""

    train: list  # GRPO's training prompts
    held: list  # held-out prompts: every evaluation's
    pairs: list | None  # DPO's training pairs
    eval_pairs: list | None  # DPO's held-out pairs


# ----------------------------------------------------------------------------- the updates
def reply_logprobs(model, seq, mask):
    """log p(token) of every reply token: seq (N, T) ids, mask (N, T) 1 on reply tokens;
    returns (N, T-1), 0 where mask[:, 1:] is 0."""
    logits = model(seq[:, :-1])[0].float()  # (N, T-1, V)
    logp = torch.log_softmax(logits, -1).gather(-1, seq[:, 1:, None]).squeeze(-1)
    return logp * mask[:, 1:]


def grpo_step(model, batch, cfg, reference=None):
    """One GRPO update's loss and backward on this rank's share of the sampled replies.
    batch: seq (N, T), mask (N, T), advantages (N,), old_logp (N, T-1) (the sampling
    policy's, for the ratio), ref_logp (for the KL term) and `total`, the global count
    the loss is divided by (tokens or replies: the same loss on 1 rank or many)."""
    m = batch["mask"][:, 1:].float()
    logp = reply_logprobs(model, batch["seq"], batch["mask"])
    # On-policy (updates_per_batch=1) the ratio is 1 and its gradient that of logp:
    # REINFORCE with a group baseline. Later updates clip it (PPO).
    ratio = torch.exp(logp - batch["old_logp"])
    A = batch["advantages"][:, None]  # (N, 1): a reply's advantage, on each of its tokens
    clipped = torch.clamp(ratio, 1 - cfg.clip_eps, 1 + cfg.clip_eps)
    per_token = -torch.minimum(ratio * A, clipped * A)
    if cfg.kl_coef > 0:  # k3, an unbiased and positive KL estimate (Schulman; DeepSeekMath)
        d = batch["ref_logp"] - logp
        per_token = per_token + cfg.kl_coef * (torch.exp(d) - d - 1)
    per_token = per_token * m
    if cfg.loss_norm == "token":
        loss = per_token.sum() / batch["total"]
    else:
        loss = (per_token.sum(1) / m.sum(1).clamp(min=1)).sum() / batch["total"]
    loss.backward()
    return loss.detach()


def dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta, label_smoothing,
             kind="sigmoid"):
    """DPO's loss per pair from each reply's summed log-probability (Rafailov et al. 2023,
    eq. 7): -log sigmoid(beta * (policy margin - reference margin)). With label smoothing
    eps, sigmoid mixes in the flipped label (cDPO); robust subtracts it, / (1 - 2 eps) (rDPO)."""
    logits = beta * ((policy_chosen - policy_rejected) - (ref_chosen - ref_rejected))
    right, flipped = -F.logsigmoid(logits), -F.logsigmoid(-logits)
    if kind == "robust":
        eps = label_smoothing
        return ((1 - eps) * right - eps * flipped) / (1 - 2 * eps)
    return (1 - label_smoothing) * right + label_smoothing * flipped


def dpo_step(model, batch, cfg, reference):
    """DPO's loss and backward on this rank's pairs: batch seq (2P, T) chosen rows then
    rejected rows, mask (2P, T), `total` the global number of pairs."""
    logp = reply_logprobs(model, batch["seq"], batch["mask"]).sum(1)  # (2P,)
    with torch.no_grad():
        ref = reference(batch["seq"], batch["mask"]).sum(1)
    P = logp.size(0) // 2
    losses = dpo_loss(logp[:P], logp[P:], ref[:P], ref[P:], cfg.beta, cfg.label_smoothing,
                      cfg.dpo_loss)
    loss = losses.sum() / batch["total"]
    loss.backward()
    return loss.detach()


def update(step, loss_of, chunks, cfg, lr_scale):
    """One optimizer step: the loss of every chunk (gradients summed), the ranks' gradients
    summed in one all-reduce (each loss was divided by the global count already),
    clipped, stepped, as train.py's step clips and sets the rate (gptkit/train/step.py)."""
    loss = sum(loss_of(step.model, chunk, cfg, step.reference) for chunk in chunks)
    loss = torch.as_tensor(loss, dtype=torch.float32)
    distributed.sum_gradients(step.params, step.dist)
    loss = distributed.all_reduce_sum(loss.clone(), step.dist).item()
    norm = clip_gradients(step.model, cfg.grad_clip).item()
    if not (math.isfinite(loss) and math.isfinite(norm)):
        raise NonFinite(f"the loss is {loss}, the gradient norm {norm}")
    set_lr(step.optimizers, lr_scale)
    for opt in step.optimizers:
        opt.step()
        opt.zero_grad(set_to_none=True)
    return loss, norm


def grpo_update(step, prompts, cfg, it, lr_scale):
    """GRPO's step `it`: sample and score this rank's groups, then updates_per_batch
    optimizer steps on them (1: on-policy). Returns (loss, gradient norm, mean reward)."""
    chunks, mean_reward = grpo_batch(step.model, step.chat, prompts, cfg, it, step.dist, step.device,
                                     step.reward, step.reference)
    for _ in range(cfg.updates_per_batch):
        loss, norm = update(step, grpo_step, chunks, cfg, lr_scale)
    return loss, norm, mean_reward


def dpo_update(step, pairs, cfg, it, lr_scale):
    """DPO's step `it`: this rank's share of pairs_per_step pairs, one optimizer step.
    Returns (loss, gradient norm, None: DPO samples no reply to reward)."""
    mine = [p for _, p in step_items(pairs, cfg.pairs_per_step, cfg, it, step.dist)]
    chunks = pair_chunks(step.chat, mine, cfg, step.device, total=min(cfg.pairs_per_step, len(pairs)))
    loss, norm = update(step, dpo_step, chunks, cfg, lr_scale)
    return loss, norm, None


class NonFinite(Exception):
    pass


# ----------------------------------------------------------------------------- the data
class Chat:
    """A chat model's tokens: prompts as the template gives them, replies back as text."""

    def __init__(self, tokenizer, chat_entry, source, block_size, vocab_size):
        if not isinstance(chat_entry, dict):
            raise UserError(f"{source} is not a chat model (train it on a chat dataset first: "
                            "docs/chat.md)")
        self.tokenizer, self.base = tokenizer, tokenizer.vocab_size
        self.end = turn_ids(self.base)["<|end|>"]
        self.block_size = block_size
        special = chat_vocabulary(vocab_size, self.base) or {}
        self.tools = special if "<|call|>" in special else None  # a model trained on calculator calls

    def prompt(self, messages):
        return prompt_ids(messages, self.tokenizer.encode, self.base)

    def fit(self, ids, room):
        """A prompt's ids with `room` tokens after them in one training row, whose inputs
        (all its tokens but the last) the model's block must hold: as they are where they
        fit, else their oldest tokens dropped (check_lengths refused them unless
        too_long=crop)."""
        keep = self.block_size + 1 - room
        return ids[-keep:] if len(ids) > keep else ids

    def reply_ids(self, text):
        return [*self.tokenizer.encode(text), self.end]

    def text(self, tokens):
        """A reply's text: its tokens up to its <|end|>, a stray turn token as its marker."""
        out, plain = [], []
        for t in tokens:
            if t == self.end:
                break
            if t >= self.base:
                out += [self.tokenizer.decode(plain), turn_marker(t, self.base)]
                plain = []
            else:
                plain.append(t)
        return "".join(out) + self.tokenizer.decode(plain)

    def final_text(self, tokens):
        """What a reward reads: a tool model's reply after its last tool output, else the text."""
        if self.tools is not None and self.tools["<|/output|>"] in tokens:
            tokens = tokens[len(tokens) - tokens[::-1].index(self.tools["<|/output|>"]):]
        return self.text(tokens)


def padded(rows, masks, pad):
    """Lists of ids and of masks as (N, T) tensors, right-padded (mask 0) to the longest."""
    T = max(len(r) for r in rows)
    seq = torch.tensor([r + [pad] * (T - len(r)) for r in rows], dtype=torch.long)
    mask = torch.tensor([m + [0] * (T - len(m)) for m in masks], dtype=torch.long)
    return seq, mask


def sample_replies(model, ids, n, temperature, top_k, max_new_tokens, end, generator):
    """n replies to one prompt (ids), sampled together with the KV cache: a list of n
    lists of tokens, each up to and with its first <|end|> (or max_new_tokens long)."""
    idx = torch.tensor([ids] * n, dtype=torch.long, device=generator.device)  # (n, T0)
    steps = list(generate_stream(model, idx, max_new_tokens, temperature=temperature, top_k=top_k,
                                 stop_tokens=[end], generator=generator))
    out = []
    for row in torch.stack(steps, 1).tolist():  # (n, R): after <|end|> it repeats
        out.append(row[: row.index(end) + 1] if end in row else row)
    return out


def tool_replies(model, chat, prompts, temperature, top_k, max_new_tokens, generator):
    """For a model with tool tokens: (replies, masks) to `prompts` (lists of ids), sampled
    together as serve.py's batch rows are, each call the model closes run by the calculator
    and its output forced in (gptkit/serve/batch.py). A reply's mask is 1 on the tokens the
    model wrote and 0 on the forced ones: the tool's output carries no gradient."""
    from types import SimpleNamespace

    from gptkit.generation.generate import TextStream
    from gptkit.serve.batch import Batch, Row

    settings = SimpleNamespace(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=None,
                               min_p=None, repetition_penalty=1.0, stop=None)
    batch, rows = Batch(model, generator.device), []
    for ids in prompts:
        g = torch.Generator(device=generator.device)
        g.manual_seed(int(torch.randint(2**62, (1,), generator=generator, device=generator.device)))
        rows.append(Row(list(ids), settings, TextStream(chat.tokenizer, None, [chat.end]), g,
                        lambda row, token, logprobs: None, tools=chat.tools))
        batch.add(rows[-1])
    while len(batch):
        batch.step()
    replies, masks = [], []
    for ids, row in zip(prompts, rows):
        reply, mask, calls = row.tokens[len(ids):], [], iter(row.calls)
        while len(mask) < len(reply):
            mask.append(1)
            if reply[len(mask) - 1] == chat.tools["<|/call|>"] and (call := next(calls, None)) is not None:
                mask += [0] * len(call["ids"])  # forced right after the call it answers
        room = chat.block_size + 1 - len(ids)  # a training row holds block_size + 1 tokens
        replies.append(reply[:room])
        masks.append(mask[:room])
    return replies, masks


def generator_for(cfg, step, index, device):
    """The samples of prompt `index` at `step`: the same on any number of ranks and after
    a resume, since no state carries from one step to the next."""
    g = torch.Generator(device=device)
    return g.manual_seed(cfg.seed * 1_000_003 + step * 10_007 + index)


def step_items(items, n, cfg, step, dist):
    """(global index, item) of this rank's share of step `step`'s n items, drawn by the seed."""
    chosen = random.Random(cfg.seed * 7919 + step).sample(range(len(items)), min(n, len(items)))
    return [(i, items[i]) for i in chosen][dist.rank::dist.world_size]


@torch.no_grad()
def grpo_batch(model, chat, prompts, cfg, step, dist, device, reward, logprobs_of_reference):
    """Sample this rank's groups and score them: (chunks for grpo_step, mean reward)."""
    model.eval()
    rows, masks, advantages, rewards = [], [], [], []
    for index, prompt in step_items(prompts, cfg.prompts_per_step, cfg, step, dist):
        ids = chat.fit(chat.prompt(prompt.messages), cfg.max_new_tokens)
        if chat.tools is not None:  # the calculator runs in the rollouts; its outputs are not learned
            replies, reply_masks = tool_replies(model, chat, [ids] * cfg.group_size, cfg.temperature, cfg.top_k,
                                                cfg.max_new_tokens, generator_for(cfg, step, index, device))
        else:
            replies = sample_replies(model, ids, cfg.group_size, cfg.temperature, cfg.top_k,
                                     cfg.max_new_tokens, chat.end,
                                     generator_for(cfg, step, index, device))
            reply_masks = [[1] * len(reply) for reply in replies]
        r = torch.tensor([scored(reward, cfg, chat.final_text(reply), prompt, f"prompt {index + 1}")
                          for reply in replies])
        a = r - r.mean()  # the group's mean is the baseline (GRPO; nanochat stops here)
        if cfg.advantage == "zscore":
            a = a / (r.std() + 1e-4)  # DeepSeekMath; TRL's epsilon
        rows += [ids + reply for reply in replies]
        masks += [[0] * len(ids) + mask for mask in reply_masks]
        advantages.append(a)
        rewards.append(r)
    model.train()
    seq, mask = padded(rows, masks, chat.end)
    seq, mask = seq.to(device), mask.to(device)
    counts = torch.tensor([float(mask[:, 1:].sum()), float(len(rows)),
                           float(torch.cat(rewards).sum())], device=device)
    tokens, replies, reward_sum = distributed.all_reduce_sum(counts, dist).tolist()
    total = tokens if cfg.loss_norm == "token" else replies
    advantages = torch.cat(advantages).to(device)
    chunks = []
    for s in range(0, seq.size(0), cfg.batch_size):
        part = slice(s, s + cfg.batch_size)
        chunk = {"seq": seq[part], "mask": mask[part], "advantages": advantages[part],
                 "total": total}
        chunk["old_logp"] = reply_logprobs(model, chunk["seq"], chunk["mask"])
        if cfg.kl_coef > 0:
            chunk["ref_logp"] = logprobs_of_reference(chunk["seq"], chunk["mask"])
        chunks.append(chunk)
    return chunks, reward_sum / replies


def check_lengths(chat, data, cfg):
    """Every prompt and pair encoded before anything is written: a character outside the
    vocabulary is named by its file and line, and a training row past the model's block
    (prompt and reply, or max_new_tokens) is refused, or with too_long=crop counted and
    cropped (Chat.fit). Returns the line that counts the cropped ones, or None."""
    rows = [(p, cfg.max_new_tokens, "max_new_tokens") for p in data.train] if cfg.method == "grpo" else []
    for pair in (data.pairs or []) + (data.eval_pairs or [])[: cfg.eval_prompts]:
        for reply in (pair.chosen, pair.rejected):
            rows.append((pair, len(encoded(chat.reply_ids, reply, pair)), "its reply"))
    for prompt in data.held[: cfg.eval_prompts]:
        encoded(chat.prompt, prompt.messages, prompt)
    cropped = {}
    for item, room, what in rows:
        n = len(encoded(chat.prompt, item.messages, item))
        if n + room - 1 <= chat.block_size:
            continue
        if room > chat.block_size or cfg.too_long == "refuse":
            fix = ("lower --max_new_tokens" if what == "max_new_tokens" else "shorten the reply")
            fix = fix if room > chat.block_size else f"shorten the prompt, {fix}, or --too_long=crop"
            raise UserError(f"{item.where}: its prompt ({n} tokens) and {what} ({room}) do not fit "
                            f"the model's block of {chat.block_size} tokens: {fix}")
        cropped.setdefault(item.where, item)
    if cropped:
        return (f"too_long=crop: {len(cropped)} prompts or pairs lose their oldest tokens to fit the "
                f"model's block of {chat.block_size} (the first: {next(iter(cropped))})")
    return None


def encoded(encode, text, item):
    """encode(text), a character outside the vocabulary named by the item's file and line."""
    try:
        return encode(text)
    except UserError as e:
        raise UserError(f"{item.where}: {e}") from None


def pair_chunks(chat, pairs, cfg, device, total):
    """DPO's rows: chosen replies then rejected ones, in chunks of at most batch_size pairs."""
    chunks = []
    for s in range(0, len(pairs), max(1, cfg.batch_size // 2)):
        part = pairs[s: s + max(1, cfg.batch_size // 2)]
        rows, masks = [], []
        for field in ("chosen", "rejected"):
            for pair in part:
                reply = chat.reply_ids(getattr(pair, field))
                ids = chat.fit(chat.prompt(pair.messages), len(reply))
                rows.append(ids + reply)
                masks.append([0] * len(ids) + [1] * len(reply))
        seq, mask = padded(rows, masks, chat.end)
        chunks.append({"seq": seq.to(device), "mask": mask.to(device), "total": total})
    return chunks


# ----------------------------------------------------------------------------- evaluation
def scored(reward, cfg, text, prompt, where):
    """reward(text, answer) as a float; a reward function that fails is one line naming
    the prompt it failed on."""
    try:
        return float(reward(text, prompt.answer))
    except Exception as e:
        raise UserError(f"reward {cfg.reward} failed on {where} ({type(e).__name__}: {e}); "
                        f"its reply was {text[:60]!r}")


@torch.no_grad()
def evaluate(model, chat, prompts, cfg, dist, device, reward):
    """(pass@1 of greedy replies, mean reward of sampled ones) on the held-out prompts,
    shared among the ranks; prompts of one length are answered as one batch."""
    model.eval()
    by_length = {}
    for index, p in list(enumerate(prompts[: cfg.eval_prompts]))[dist.rank::dist.world_size]:
        ids = chat.prompt(p.messages)
        by_length.setdefault(len(ids), []).append((index, ids, p))
    right = rewarded = 0.0
    for length, items in sorted(by_length.items()):
        for s in range(0, len(items), cfg.batch_size):
            part = items[s: s + cfg.batch_size]
            idx = torch.tensor([ids for _, ids, _ in part], dtype=torch.long, device=device)
            g = torch.Generator(device=device).manual_seed(cfg.seed + length * 65_537 + s)
            for temperature in (0.0, cfg.temperature):
                if chat.tools is not None:
                    replies, _ = tool_replies(model, chat, [ids for _, ids, _ in part], temperature, cfg.top_k,
                                              cfg.max_new_tokens, g)
                else:
                    steps = list(generate_stream(model, idx, cfg.max_new_tokens,
                                                 temperature=temperature, top_k=cfg.top_k,
                                                 stop_tokens=[chat.end], generator=g))
                    replies = torch.stack(steps, 1).tolist()
                for reply, (index, _, p) in zip(replies, part):
                    r = scored(reward, cfg, chat.final_text(reply), p, f"held-out prompt {index + 1}")
                    if temperature == 0:
                        right += float(r == 1.0)
                    else:
                        rewarded += r
    n = min(cfg.eval_prompts, len(prompts))
    totals = distributed.all_reduce_sum(torch.tensor([right, rewarded], device=device), dist)
    model.train()
    return totals[0].item() / n, totals[1].item() / n


@torch.no_grad()
def pair_margins(model, chat, pairs, cfg, dist, device, reference):
    """(mean implicit reward margin beta * (chosen - rejected log-ratio), share of pairs it
    ranks right) on held-out pairs: DPO's own progress measure."""
    model.eval()
    mine = pairs[: cfg.eval_prompts][dist.rank::dist.world_size]
    margin = right = 0.0
    for chunk in pair_chunks(chat, mine, cfg, device, total=1):
        logp = reply_logprobs(model, chunk["seq"], chunk["mask"]).sum(1)
        ref = reference(chunk["seq"], chunk["mask"]).sum(1)
        P = logp.size(0) // 2
        m = cfg.beta * ((logp[:P] - ref[:P]) - (logp[P:] - ref[P:]))
        margin += m.sum().item()
        right += (m > 0).sum().item()
    n = min(cfg.eval_prompts, len(pairs))
    totals = distributed.all_reduce_sum(torch.tensor([margin, right], device=device), dist)
    model.train()
    return totals[0].item() / n, totals[1].item() / n


# ----------------------------------------------------------------------------- set-up
def load_start(cfg):
    """(model, Chat, checkpoint dict, start path) of init_from, or of out_dir/ckpt.pt to resume
    (whose adapters go back on their base unmerged)."""
    if cfg.init_from == "resume":
        path = Path(cfg.out_dir) / "ckpt.pt"
        if not path.is_file():
            raise UserError(f"init_from=resume but {path} does not exist: start from a chat "
                            "checkpoint")
        ckpt = load_checkpoint(path)
        if "rl_start" not in ckpt or "optimizer" not in ckpt:
            raise UserError(f"{path} is not a checkpoint of rl.py: resume it with train.py")
        if ckpt.get("lora") is not None:
            model = adapted_model(ckpt["lora"], ckpt["model"], path,
                                  ckpt["model_config"]["block_size"])
            _, tokenizer, _ = model_from_checkpoint(ckpt, path)
        else:
            model, tokenizer, _ = model_from_checkpoint(ckpt, path)
        chat = Chat(tokenizer, ckpt.get("chat"), path, model.config.block_size, model.config.vocab_size)
        return model, chat, ckpt, Path(ckpt["rl_start"])
    path = checkpoint_of(cfg.init_from)
    if path is None:
        raise UserError(f"init_from={cfg.init_from}: no checkpoint there (a .pt file or a run "
                        "folder)")
    ckpt = read_checkpoint(path)
    model, tokenizer, _ = model_from_checkpoint(ckpt, path)
    chat = Chat(tokenizer, ckpt.get("chat"), path, model.config.block_size, model.config.vocab_size)
    if cfg.lora_rank:
        targets = lora.parse_targets(cfg.lora_targets)
        lora.check_rank(model, cfg.lora_rank, targets)
        lora.apply(model, cfg.lora_rank, cfg.lora_alpha or cfg.lora_rank, cfg.lora_dropout, targets)
        model.lora_spec["base"] = {"init_from": str(path.resolve()),
                                   "fingerprint": lora.fingerprint(model)}
    return model, chat, ckpt, path.resolve()


def reference_for(model, cfg, start):
    """log-probs of reply tokens under the frozen starting model: the base itself with the
    adapters switched off (LoRA: no second copy), else the start checkpoint loaded again;
    None where nothing needs one (GRPO without a KL term)."""
    if cfg.method == "grpo" and cfg.kl_coef == 0:
        return None
    if lora.is_applied(model):
        def logprobs(seq, mask):
            with torch.no_grad(), lora.disabled(model):
                return reply_logprobs(model, seq, mask)
        return logprobs
    frozen, _, _ = model_from_checkpoint(read_checkpoint(start), start)
    frozen = frozen.to(next(model.parameters()).device).requires_grad_(False)
    return lambda seq, mask: reply_logprobs(frozen, seq, mask)


def tasks(cfg):
    """The prompts and pairs the method reads (Data)."""
    train = rl_data.named_prompts(cfg.task, "train")
    held = rl_data.named_prompts(cfg.eval_task or cfg.task, "val")
    if cfg.method == "grpo":
        return Data(train, held, None, None)
    if cfg.pairs == "arithmetic":
        pairs = rl_data.arithmetic_pairs("train", cfg.seed)
    else:
        pairs = rl_data.read_pairs(cfg.pairs)
    if cfg.eval_pairs is not None:
        eval_pairs = rl_data.read_pairs(cfg.eval_pairs)
    else:
        eval_pairs = rl_data.arithmetic_pairs("val", cfg.seed) if cfg.pairs == "arithmetic" else pairs
    return Data(train, held, pairs, eval_pairs)


def main(argv=None):
    try:
        (cfg,) = parse_settings(argv, [RLConfig], prog="rl.py", description=__doc__)
        if cfg.wandb_log:
            logger.check_wandb_ready()
        data = tasks(cfg)  # every bad file or item: one line, before anything is written
    except UserError as e:
        raise same_on_every_rank(e)
    device = str(resolve_device(cfg.device))
    dist = distributed.init(cfg.backend, device.split(":")[0])
    claim, ok = None, False
    try:
        if dist.is_main:
            claim = OutDir(cfg)
        distributed.barrier(dist)
        code = run(cfg, data, dist, device)
        ok = True
        return code
    finally:
        if claim is not None:
            claim.release(ok)
        distributed.cleanup(dist, ok)


def evaluation(step, data, cfg, it):
    """The record of an evaluation at step `it`: greedy pass@1 and the sampled replies'
    mean reward on the held-out prompts; for DPO also the held-out pairs' margin."""
    pass1, mean_reward = evaluate(step.model, step.chat, data.held, cfg, step.dist, step.device,
                                  step.reward)
    rec = {"kind": "rl_eval", "iter": it, "pass1": pass1, "mean_reward": mean_reward}
    if cfg.method == "dpo":
        rec["margin"], rec["pair_accuracy"] = pair_margins(
            step.model, step.chat, data.eval_pairs, cfg, step.dist, step.device, step.reference)
    return rec


def eval_line(rec):
    return " | ".join([f"eval {rec['iter']}"] + [f"{k} {v:.4f}" for k, v in rec.items()
                                                  if k not in ("kind", "iter")])


def train_line(rec, max_iters):
    """A step's console line; DPO's has no reward (it samples no reply)."""
    reward = f"reward {rec['reward']:.3f} | " if "reward" in rec else ""
    return (f"step {rec['iter']}/{max_iters} | loss {rec['loss']:.4f} | {reward}"
            f"norm {rec['grad_norm']:.2f} | {rec['ms_per_iter']:.0f} ms")


def done_line(state, last, out_dir, seconds):
    """The closing line: the trained model's figures (its last evaluation), and the best
    pass@1 of the run (best.pt's)."""
    trained = f"pass@1 {state.pass1:.4f}"
    if last is not None and "margin" in last:
        trained += (f", held-out margin {last['margin']:.4f} ({last['pair_accuracy']:.1%} of pairs "
                    "ranked right)")
    return (f"done: {state.iter_num} steps; the trained model: {trained}; best pass@1 "
            f"{state.best_pass1:.4f}; checkpoints in {out_dir} ({logger.format_duration(seconds)})")


def run(cfg, data, dist, device):
    """Set up, then the loop: evaluate (and save) every eval_interval steps, one update a step."""
    start_time = time.monotonic()
    out_dir = Path(cfg.out_dir)
    torch.manual_seed(cfg.seed)  # LoRA's new adapters and dropout: the same on every rank and run
    model, chat, ckpt, start = load_start(cfg)
    cropped = check_lengths(chat, data, cfg)  # a bad item: one line, before anything is written
    model.to(device).train()
    optimizers = optim.make_optimizers(model, cfg, device.split(":")[0])
    step = Step(model, chat, optimizers, [p for p in model.parameters() if p.requires_grad],
                reference_for(model, cfg, start), rl_data.REWARDS[cfg.reward], dist, device)
    state = RLState()
    if cfg.init_from == "resume":
        for opt, saved in zip(optimizers, ckpt["optimizer"]):
            opt.load_state_dict(saved)
        set_rng_state(ckpt["rng"], device)
        state = RLState(**{f.name: ckpt[f.name] for f in dataclasses.fields(RLState)})
        if dist.is_main:
            logger.trim_metrics(out_dir / "metrics.jsonl", state.iter_num, eval_kind="rl_eval")
    recorded = settings_dict(cfg)
    info = {"model_config": dataclasses.asdict(model.config), "tokenizer": ckpt["tokenizer"],
            "config": recorded, "data_fingerprint": ckpt.get("data_fingerprint"),
            "dataset": ckpt.get("dataset"), "chat": ckpt["chat"], "rl_start": str(start),
            "provenance": provenance(device) if dist.is_main else None}
    ckpt = None
    saver = Checkpointer(out_dir, model, optimizers, optim.make_scaler(torch.float32, "cpu"), info,
                         dist, device, "ddp", resumed_at=state.iter_num or None)
    schedule = Schedule(cfg.max_iters, cfg.lr_decay)
    log = logger.Logger(cfg, state, recorded, dist.is_main, schedule, default_project="rl")
    if dist.is_main:
        write_text_atomic(out_dir / "config.json", json.dumps(recorded, indent=2) + "\n")
        log.print(f"rl.py {cfg.method} from {start} | {model.num_params() / 1e6:.2f}M parameters | "
                  f"world size {dist.world_size} | {device}"
                  + "".join(f"\n{line}" for line in (lora.summary(model) if lora.is_applied(model)
                                                     else None, cropped) if line))
    stop, last = distributed.StopFlag().install(), None
    try:
        while True:
            due = state.iter_num % cfg.eval_interval == 0 or state.iter_num == cfg.max_iters
            if due and state.last_eval_iter != state.iter_num:
                last = evaluation(step, data, cfg, state.iter_num)
                log.record(last, line=eval_line(last))
                improved = last["pass1"] > state.best_pass1
                state.pass1, state.last_eval_iter = last["pass1"], state.iter_num
                state.best_pass1 = max(state.best_pass1, last["pass1"])
                saver.after_eval(state, improved, always_save=True, keep_start=True)  # best.pt: best pass@1
            if state.iter_num >= cfg.max_iters:
                break
            lr_scale = schedule.lr_scale(state.iter_num)
            with log.clock.step():
                if cfg.method == "grpo":
                    loss, norm, reward = grpo_update(step, data.train, cfg, state.iter_num, lr_scale)
                else:
                    loss, norm, reward = dpo_update(step, data.pairs, cfg, state.iter_num, lr_scale)
            state.train_time_s += log.clock.last_step_s  # the clocks count steps alone
            state.train_cpu_s += log.clock.last_step_cpu_s
            if state.iter_num % cfg.log_interval == 0:  # the step's index, as train.py logs
                rec = {"kind": "rl_train", "iter": state.iter_num, "loss": loss, "reward": reward,
                       "grad_norm": norm, "lr": cfg.learning_rate * lr_scale,
                       "ms_per_iter": 1000 * log.clock.last_step_s, "train_cpu_s": state.train_cpu_s}
                rec = {k: v for k, v in rec.items() if v is not None}  # DPO: no reward
                log.record(rec, line=train_line(rec, cfg.max_iters))
            state.iter_num += 1
            if distributed.any_rank(stop.raised, dist, device):
                saver.save("ckpt", state)
                log.print(f"stopped by {stop.signal_name or 'a signal on another rank'} at step "
                          f"{state.iter_num}: saved {saver.path}; continue with --init_from=resume")
                return 0
    except NonFinite as e:
        raise saver.failed(f"{e} at step {state.iter_num}") from None
    finally:
        stop.uninstall()
        log.close()
    if dist.is_main:
        log.print(done_line(state, last, out_dir, time.monotonic() - start_time))
    return 0


if __name__ == "__main__":
    run_main(main)
