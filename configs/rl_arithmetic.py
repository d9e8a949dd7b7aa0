# RL on verifiable rewards, offline, on a CPU: a deliberately under-trained arithmetic chat
# model (configs/chat_arithmetic.py stopped at 120 of its 600 steps) learns from its own
# sampled answers, rewarded 1 when exactly right, measured on held-out sums (docs/rl.md).
#
#   python prepare.py arithmetic_chat
#   python train.py configs/chat_arithmetic.py --max_iters=120 --out_dir=out-chat-arithmetic-120
#   python rl.py configs/rl_arithmetic.py
#   python sample.py --out_dir out-rl-arithmetic --chat --temperature 0

method = "grpo"
init_from = "out-chat-arithmetic-120"
out_dir = "out-rl-arithmetic"
task = "arithmetic"
reward = "exact"

group_size = 8
prompts_per_step = 8
temperature = 1.0
max_new_tokens = 6  # a sum has at most 3 digits, then <|end|>
advantage = "mean"
loss_norm = "token"
kl_coef = 0.0
updates_per_batch = 1

optimizer = "adamw"
learning_rate = 3e-4
lr_decay = True
max_iters = 60
batch_size = 64

eval_interval = 30
eval_prompts = 400
