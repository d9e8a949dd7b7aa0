# DPO on preference pairs, offline, on a CPU: the 200-step arithmetic chat model learns from
# pairs of a right and a near-miss wrong sum, against the frozen start (docs/rl.md).
#
#   python train.py configs/chat_arithmetic.py --max_iters=200 --out_dir=out-chat-arithmetic-200
#   python rl.py configs/rl_dpo_arithmetic.py
#
# Current figure: held-out reward margin 0 -> 0.2529 (74.5% of pairs ranked right), pass@1
# 43.5% -> 42.0%, 2026-12-06, AMD EPYC Zen 4 (AVX-512 kernels; docs/rl.md), torch 2.13.0+cpu.
# Why beta 0.5: benchmarks/LOG.md.

method = "dpo"
init_from = "out-chat-arithmetic-200"
out_dir = "out-dpo-arithmetic"
task = "arithmetic"
reward = "exact"
pairs = "arithmetic"

pairs_per_step = 32
beta = 0.5
label_smoothing = 0.0
dpo_loss = "sigmoid"

optimizer = "adamw"
learning_rate = 1e-4
lr_decay = True
max_iters = 300
batch_size = 64

eval_interval = 100
eval_prompts = 400
log_interval = 25
max_new_tokens = 6  # a sum has at most 3 digits, then <|end|>
