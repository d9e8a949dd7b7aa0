# Quick start: a small character-level GPT on Tiny Shakespeare that trains on a
# 2-core CPU in about two minutes into a model worth sampling. The dataset is
# prepared on first use.
#
#   python train.py configs/shakespeare.py
#   python sample.py --start "ROMEO:"
#
# The recipe borrows the NanoGPT speedrun's ideas (modded-nanogpt, Keller Jordan
# et al. 2024) and was chosen by measurement (`python bench.py speedrun`,
# BENCHMARKS.md): it reaches the val loss nanoGPT's own CPU run ends at (1.898 on
# the whole val split after 2000 AdamW steps) in 0.45-0.5x of nanoGPT's CPU
# seconds at one thread (0.33x on our loaded machine), and ends near 1.70.
# On a GPU it takes seconds; configs/shakespeare_char.py is the bigger GPU model.

out_dir = "out-shakespeare"  # sample.py's default
dataset = "shakespeare_char"

# Model: nanoGPT's CPU shape (4 layers, 4 heads, 128 wide, 64 characters of
# context) with the modern block.
n_layer = 4
n_head = 4
n_embd = 128
block_size = 64
dropout = 0.0  # 400 steps see each character ~1.3 times: nothing to regularise
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
muon_lr = 0.05
learning_rate = 3e-3  # AdamW's part
batch_size = 32  # a larger batch amortises Muon's orthogonalisation on a CPU
gradient_accumulation_steps = 1
max_iters = 400

# Warmup, stable, then a linear cooldown to zero over the last half.
lr_schedule = "wsd"
warmup_iters = 20
cooldown_frac = 0.5
min_lr = 0.0

eval_interval = 200  # at 0, 200 and 400: each evaluation costs ~4% of the run's CPU time
eval_iters = 20
log_interval = 20
