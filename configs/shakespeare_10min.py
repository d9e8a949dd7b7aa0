# The best character-level Tiny Shakespeare model one laptop thread trains in ten
# minutes of CPU time (1200 CPU seconds at one thread, the whole process: data
# preparation, evaluations and saves included), chosen by a fixed-budget sweep
# (benchmarks/LOG.md, "ten-minute recipe"; `python bench.py budget`).
#
#   OMP_NUM_THREADS=1 python train.py configs/shakespeare_10min.py
#   python sample.py --out_dir out-shakespeare-10min --start "ROMEO:"
#
# The quick start's block (configs/shakespeare.py: RoPE, RMSNorm, ReLU², QK-norm,
# zero-init projections, an untied head, a logit soft-cap, Muon), 3 layers 128 wide (4 layers
# in its bfloat16 branch, below) with 256 characters of context. Chosen by a fixed-budget sweep
# alone on the machine (benchmarks/LOG.md, 2026-12-02): at 300 CPU s the quick start's own shape led
# (1.5906) before this shape at block 128 (1.6002); at 1200 CPU s this shape reached
# 1.5145 at block 128 (2150 steps), 1.5042 at block 256 with half the batch (the
# same tokens a step, 1950 steps: the whole-split score gives each token half a
# block of context on average), and 1.4992 with muon_lr 0.025 (this config);
# dropout 0.1 then cost 0.056 (the model was still learning when the budget ended), block
# 512 and the quick start's 96 width lost. On 2026-12-04's machine, 2.4x faster (250
# against 360-590 ms a step), those 1950 steps took half the budget, and more of them
# overfit (a budget alone: 4666 steps, best 1.5243); regularised, the extra steps pay:
# Muon's weight decay 0.05 reached 1.4893 in 4505 steps, residual dropout 0.1 alone
# 1.4931, both 1.4912 (dropout's +10% a step bought fewer steps: 4175), and weight
# decay 0.1 1.4752 and 1.4694 on two seeds (4189 and 4600 steps). On 2026-12-06, alone on
# an AMD EPYC (~290 ms a step), the 1-sqrt cooldown (cooldown_shape; Hägele et al. 2024:
# the rate falls fast at first, then lingers low) scored 1.4641 and 1.4653 on seeds 1337
# and 1 (4013 and 3924 steps; this config). The run ends at max_iters or when
# time_budget = 1160 CPU s of the process (evaluations left out) are spent, whichever
# comes first, the decay following whichever share is further along; the 40 s left of
# 1200 pay for its evaluations (each ~5 s). With two threads it takes about as long in
# wall time as one (a 2-core laptop's two threads are often one core).
#
# On a CPU with bfloat16 instructions the run autocasts to bfloat16 (below): on 2026-12-07's
# AMD EPYC a step took ~200 against ~290 ms; 1200 CPU s scored 1.4476 and 1.4587 on seeds
# 1337 and 1 (~5,650 steps; 1.4530 and 1.4506 earlier that day: two runs of one seed differ
# by up to ~0.008, the schedule following the clock), 160 wide 1.4409 and 1.4523 (~4,100-4,300
# steps), and 4 layers (this config's bfloat16 branch) 1.4480 (1.4417 in a second run) and
# 1.4442 (~4,400-4,600 steps). Five minutes: configs/shakespeare_5min.py.

from gptkit.ops.device import cpu_computes_bf16

out_dir = "out-shakespeare-10min"
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
    # Half again the steps overfit more (~24 passes over the text): at 1200 CPU s, seed 1337,
    # Muon's weight decay 0.1 scored 1.4828, 0.2 1.4620, 0.3 1.4530, 0.4 1.4540 (benchmarks/LOG.md).
    muon_weight_decay = 0.3
    # With the decay holding it, a larger model pays for its dearer steps. At seeds 1337 and 1
    # (2026-12-07, benchmarks/LOG.md): 3 layers 128 wide ended at 1.4476-1.4587 (four runs),
    # 160 wide at 1.4409 and 1.4523 (~260 ms a step, ~4,100 steps), 4 layers 128 wide at 1.4480
    # and 1.4442 (~240-270 ms, ~4,400-4,600 steps); block 512 at batch 8 (160 wide) tied block
    # 256 on seed 1.
    n_layer = 4
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
