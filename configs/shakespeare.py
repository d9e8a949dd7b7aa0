# Quick start: a small character-level GPT on Tiny Shakespeare, sized to train
# on a 2-core CPU in a few minutes into a model worth sampling (names, line
# breaks and verse shape; nanoGPT's CPU recipe of this size, batch 12 at lr 1e-3,
# reaches a val loss of ~1.88 in 2000 steps). The dataset is prepared on first use.
#
#   python train.py configs/shakespeare.py
#   python sample.py --start "ROMEO:"
#
# On a GPU it takes seconds (compile is on there by default, which costs ~30 s
# once); configs/shakespeare_char.py is the bigger GPU model.

out_dir = "out-shakespeare"  # sample.py's default
dataset = "shakespeare_char"

n_layer = 4
n_head = 4
n_embd = 128
block_size = 64  # characters of context
dropout = 0.0  # too few steps to overfit
bias = False

batch_size = 16
gradient_accumulation_steps = 1
max_iters = 2000

learning_rate = 2e-3
warmup_iters = 100
lr_decay_iters = 2000  # = max_iters
min_lr = 2e-4  # learning_rate / 10
beta2 = 0.99  # few tokens per step (as nanoGPT's baby GPT)

eval_interval = 250
eval_iters = 20
log_interval = 50
