# Character-level Tiny Shakespeare in 1200 CPU seconds of one thread (the whole process: twenty
# minutes of wall time), the best shape and schedule a fixed-budget sweep found (`python bench.py
# budget`). Ten minutes on two cores: configs/shakespeare_10min.py.
#
#   OMP_NUM_THREADS=1 python train.py configs/shakespeare_1200cpus.py
#
# Current figure: val loss 1.4417 on the whole val split (seed 1337; 1.4442 seed 1), 2026-12-07,
# AMD EPYC Zen 4 (AVX-512 BF16: the bfloat16 branch below), torch 2.13.0+cpu; its float32
# branch on an AVX2 AMD EPYC Zen 3: 1.4690 (seed 1337). How it was found: benchmarks/LOG.md.

from gptkit.ops.device import cpu_computes_bf16

out_dir = "out-shakespeare-1200cpus"
dataset = "shakespeare_char"

n_layer = 3
n_head = 4
n_embd = 128
mlp_hidden = 256
block_size = 256
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
muon_lr = 0.025
learning_rate = 3e-3
weight_decay = 0.0
muon_weight_decay = 0.1
batch_size = 16
gradient_accumulation_steps = 1
time_budget = 1160.0  # CPU seconds (train.py --time_budget)
max_iters = 4600  # or the budget, if spent first (4189-4600 steps on a 250 ms day)

# On a CPU with bfloat16 instructions (AVX-512 BF16 or AMX: AMD Zen 4 and later, Intel Xeon
# since Cooper Lake), autocast to bfloat16 with attention as two batched products (model.py's
# matmul_attention) runs a step in ~0.65 of float32 with SDPA's time, so the budget holds ~1.5x
# the steps; the scores are the same in float32 (eval.py --dtype float32). Elsewhere bfloat16
# is emulated and slower: float32 with SDPA, as before.
if cpu_computes_bf16():
    dtype = "bfloat16"
    attention = "matmul"
    max_iters = 6000  # the budget ends the run first (~5,800 steps at ~200 ms)
    muon_weight_decay = 0.3  # half again the steps overfit more: 0.1-0.4 swept (LOG)
    n_layer = 4  # 4 layers 128 wide beat 3 layers 128 and 160 wide at this budget (LOG)
    # Evaluations in bfloat16 take ~3 CPU s and the kernel's time is ~1 s (train.py keeps freed
    # memory, gptkit/ops/device.py): the whole process ends at ~1192 CPU s with 1176 of steps.
    time_budget = 1176.0

lr_schedule = "wsd"
warmup_iters = 40
cooldown_frac = 0.5
cooldown_shape = "1-sqrt"
min_lr = 0.0

# Every evaluation scores the whole validation split (eval_iters = 0): at 0, every 3000
# steps and at the end, each ~3-5 CPU s, the best being the run's score (three, against five
# at 1500 until 2026-12-07: their CPU seconds go to training steps instead).
eval_iters = 0
eval_interval = 3000
log_interval = 100
