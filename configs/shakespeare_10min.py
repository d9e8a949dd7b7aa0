# The best character-level Tiny Shakespeare model one laptop thread trains in ten
# minutes of CPU time (1200 CPU seconds at one thread, the whole process: data
# preparation, evaluations and saves included), chosen by a fixed-budget sweep
# (benchmarks/LOG.md, "ten-minute recipe"; `python bench.py budget`).
#
#   OMP_NUM_THREADS=1 python train.py configs/shakespeare_10min.py
#   python sample.py --out_dir out-shakespeare-10min --start "ROMEO:"
#
# The quick start's block (configs/shakespeare.py: RoPE, RMSNorm, ReLU², QK-norm,
# zero-init projections, an untied head, a logit soft-cap, Muon), grown to what six
# times the quick start's budget pays for. With two threads it takes about as long
# in wall time as one thread does (a 2-core laptop's two threads are often one core).

out_dir = "out-shakespeare-10min"
dataset = "shakespeare_char"

n_layer = 3
n_head = 4
n_embd = 128
mlp_hidden = 256
block_size = 128
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
max_iters = 2150

lr_schedule = "wsd"
warmup_iters = 40
cooldown_frac = 0.5
min_lr = 0.0

# Every evaluation scores the whole validation split (eval_iters = 0); five of them,
# each a few seconds, the last being the run's score.
eval_iters = 0
eval_interval = 1075
log_interval = 100
