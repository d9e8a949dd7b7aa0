# The best character-level Tiny Shakespeare model one laptop thread trains in ten
# minutes of CPU time (1200 CPU seconds at one thread, the whole process: data
# preparation, evaluations and saves included), chosen by a fixed-budget sweep
# (benchmarks/LOG.md, "ten-minute recipe"; `python bench.py budget`).
#
#   OMP_NUM_THREADS=1 python train.py configs/shakespeare_10min.py
#   python sample.py --out_dir out-shakespeare-10min --start "ROMEO:"
#
# The quick start's block (configs/shakespeare.py: RoPE, RMSNorm, ReLU², QK-norm,
# zero-init projections, an untied head, a logit soft-cap, Muon), 128 wide with 128
# characters of context. Screened at 300 CPU s (benchmarks/LOG.md, 2026-12-02 15:10):
# the quick start's own shape 1.5906, this shape 1.6002, four layers 1.6118 (over the
# budget), four layers at block 64 1.6140; at 1200 CPU s this shape reached 1.5145
# on the whole val split in 1104 CPU s (train loss 1.22: it starts to overfit 1M
# characters: dropout is the next lever to measure, not yet set). With two threads it takes about as long in wall time
# as one (a 2-core laptop's two threads are often one core).

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
