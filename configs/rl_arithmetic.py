# RL on verifiable rewards, offline, on a CPU: a deliberately under-trained arithmetic chat
# model (configs/chat_arithmetic.py stopped at 200 of its 600 steps: ~43% of held-out sums
# right, where the full run gets them all) learns from its own sampled answers, rewarded 1
# when exactly right, measured on held-out sums (docs/rl.md). 300 steps, ~330 CPU seconds
# on a shared 2-vCPU machine (the budget: 600): 43.5% -> 69.25% held-out pass@1
# (BENCHMARKS.md).
#
#   python prepare.py arithmetic_chat
#   python train.py configs/chat_arithmetic.py --max_iters=200 --out_dir=out-chat-arithmetic-200
#   python rl.py configs/rl_arithmetic.py
#   python sample.py --out_dir out-rl-arithmetic --chat --temperature 0
#
# Why this start and these sizes (benchmarks/LOG.md): from a 120-step SFT (5% right) most
# groups earn no reward at all and the updates are mostly noise (+5.5 points); from 200 steps a
# sampled reply is right ~20-25% of the time, so most groups hold right and wrong replies
# to tell apart. 32 prompts x 16 replies a step (8 x 8 gained 5.5 points in 300 steps,
# falling to 31% on the way).

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
