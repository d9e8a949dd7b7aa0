# Chat, offline, on a CPU in a few minutes: a small character-level model learns to answer
# "What is 37+45?" with "82", trained on the assistant's replies only, measured on sums it
# never saw answered (docs/chat.md). The quick start's block, a context of 63 tokens.
#
#   python train.py configs/chat_arithmetic.py          # prepares data/arithmetic_chat first
#   python eval.py out-chat-arithmetic --dataset arithmetic_chat --exact_match
#   python sample.py --out_dir out-chat-arithmetic --chat --temperature 0
#
# Figures (600 steps, and the 200-step start of the RL recipes): docs/chat.md, benchmarks/LOG.md.

out_dir = "out-chat-arithmetic"
dataset = "arithmetic_chat"

n_layer = 3
n_head = 4
n_embd = 128
mlp_hidden = 256
block_size = 64
dropout = 0.0
bias = False
pos_encoding = "rope"
norm = "rmsnorm"
mlp = "relu2"
qk_norm = True
zero_init_proj = True
tie_embeddings = False
logit_softcap = 15.0

optimizer = "muon"
muon_lr = 0.03
learning_rate = 3e-3
weight_decay = 0.0
batch_size = 32
gradient_accumulation_steps = 1
max_iters = 600  # ~1 CPU minute: 100% of the held-out replies here (1500 steps: 99.8%, benchmarks/LOG.md)

lr_schedule = "wsd"
warmup_iters = 40
cooldown_frac = 0.5
min_lr = 0.0

eval_interval = 200
eval_iters = 20
log_interval = 50
