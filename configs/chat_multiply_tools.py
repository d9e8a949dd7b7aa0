# A model that uses a calculator, offline, on a CPU: a small character-level model learns to
# answer "What is 1234*5678?" by calling the calculator and copying its output, and is
# measured on products it never saw asked (docs/chat.md, "Tool calls").
#
#   python train.py configs/chat_multiply_tools.py       # prepares data/multiply_tools first
#   python eval.py out-chat-multiply --dataset multiply_tools --exact_match --tools calculator
#   python sample.py --out_dir out-chat-multiply --chat --temperature 0
#
# The same model trained on multiply_plain (the products answered by heart) for the same
# steps: --dataset multiply_plain --out_dir out-chat-multiply-plain. Figures: benchmarks/LOG.md.

out_dir = "out-chat-multiply"
dataset = "multiply_tools"

n_layer = 3
n_head = 4
n_embd = 128
mlp_hidden = 256
block_size = 64  # a conversation with its call and output is 52 tokens
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
max_iters = 600

lr_schedule = "wsd"
warmup_iters = 40
cooldown_frac = 0.5
min_lr = 0.0

eval_interval = 200
eval_iters = 20
log_interval = 50
