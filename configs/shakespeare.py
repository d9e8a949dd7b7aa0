# Quick start: a small character-level GPT on Tiny Shakespeare (modded-nanogpt's ideas: RoPE,
# RMSNorm, ReLU², QK-norm, Muon) that trains on a 2-core CPU in about two minutes; the
# dataset is prepared on first use.
#
#   python train.py configs/shakespeare.py
#   python sample.py --start "ROMEO:"
#
# Current figure: val loss 1.5903 after 1300 steps (1m28s), 2026-12-06, AMD EPYC Zen 4,
# torch 2.13.0+cpu (README). Why this shape: BENCHMARKS.md's ablations, benchmarks/LOG.md.

out_dir = "out-shakespeare"  # sample.py's default
dataset = "shakespeare_char"

# Model: narrower and shallower than nanoGPT's CPU shape (4 layers, 128 wide), with
# the same 64 characters of context and the modern block. Measured at a fixed CPU
# budget: 3 layers beat 4 and 2; 96 wide beats 128 and ties 64; an MLP twice as wide as
# the stream (not four times) pays for its extra steps; 32 or 128 characters of
# context are worse than 64.
n_layer = 3
n_head = 4
n_embd = 96
mlp_hidden = 192
block_size = 64
dropout = 0.0  # 1300 x 32 windows of 64: each character ~2.7 times; the val loss still falls at the end
bias = False
pos_encoding = "rope"  # rotary positions (Su et al. 2021)
norm = "rmsnorm"
mlp = "relu2"  # ReLU squared (So et al. 2021, "Primer"), as in modded-nanogpt
qk_norm = True  # normalised queries and keys keep attention logits tame at high learning rates
zero_init_proj = True  # every block starts as the identity (modded-nanogpt)
tie_embeddings = False  # a separate output layer, trained by AdamW
logit_softcap = 15.0  # 15 * tanh(logits / 15), modded-nanogpt's cap

# Optimizer: Muon for the block matrices, AdamW for embeddings, head and gains.
optimizer = "muon"
muon_lr = 0.03  # 0.02-0.03 measured best here (0.05 and 0.08 worse)
learning_rate = 3e-3  # AdamW's part (6e-3 measured worse)
weight_decay = 0.0  # AdamW's matrices here are the embedding and the head: decaying them cost ~0.004
batch_size = 32  # 16 or 24 with more steps did worse per CPU second (Muon's cost is per step)
gradient_accumulation_steps = 1
max_iters = 1300

# Warmup, stable, then a linear cooldown to zero over the last half.
lr_schedule = "wsd"
warmup_iters = 40
cooldown_frac = 0.5  # 0.65 and 0.7 measured no better
min_lr = 0.0

eval_interval = 325  # at 0, 325, 650, 975 and 1300: each evaluation costs ~1% of the run's CPU time
eval_iters = 20
log_interval = 50
