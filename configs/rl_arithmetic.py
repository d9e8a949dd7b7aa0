# GRPO on verifiable rewards, offline, on a CPU: the 200-step arithmetic chat model
# (configs/chat_arithmetic.py stopped early) learns from its own sampled answers, rewarded 1
# when exactly right, measured on held-out sums (docs/rl.md).
#
#   python train.py configs/chat_arithmetic.py --max_iters=200 --out_dir=out-chat-arithmetic-200
#   python rl.py configs/rl_arithmetic.py
#
# Current figure: 43.5% -> 69.25% held-out pass@1 in 300 steps (~330 CPU s), 2026-12-06,
# AMD EPYC Zen 4 (torch's AVX-512 kernels; its AVX2 ones: 24.5% -> 54.75%, docs/rl.md),
# torch 2.13.0+cpu. Why these sizes: benchmarks/LOG.md.

method = "grpo"
init_from = "out-chat-arithmetic-200"
out_dir = "out-rl-arithmetic"
task = "arithmetic"
reward = "exact"

group_size = 16  # nanochat's
prompts_per_step = 32
temperature = 1.0
max_new_tokens = 6  # a sum has at most 3 digits, then <|end|>
advantage = "mean"
loss_norm = "token"
kl_coef = 0.0
updates_per_batch = 1

optimizer = "adamw"
learning_rate = 3e-4  # 1e-4: +15 points in the same steps
lr_decay = True
max_iters = 300
batch_size = 64

eval_interval = 100
eval_prompts = 400
log_interval = 25
