# DPO on preference pairs, offline, on a CPU: the short arithmetic SFT (configs/chat_arithmetic.py
# stopped at 200 of its 600 steps, as configs/rl_arithmetic.py starts) learns from pairs of a
# right and a near-miss wrong sum (off by 1 or 10), against the frozen starting checkpoint
# (docs/rl.md).
#
#   python prepare.py arithmetic_chat
#   python train.py configs/chat_arithmetic.py --max_iters=200 --out_dir=out-chat-arithmetic-200
#   python rl.py configs/rl_dpo_arithmetic.py
#
# Measured (benchmarks/LOG.md, 2026-12-06, ~35 CPU s each): on 400 held-out pairs the reward
# margin rose from 0 to 0.2529 with 74.5% of pairs ranked right at beta 0.5; held-out pass@1
# went 43.5% -> 42.0%. At TRL's beta 0.1 the margin reached 0.0541 (68.5%) while pass@1 fell
# to 31.25%: a weak reference lets both replies' likelihoods fall (DPO raises the gap, not the
# right reply's probability), so this config keeps the policy closer to it.

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
