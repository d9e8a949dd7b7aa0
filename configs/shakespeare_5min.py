# The ten-minute recipe (configs/shakespeare_10min.py) in five minutes of wall time on a
# 2-core machine: the same settings at two threads, half the budget.
#
#   OMP_NUM_THREADS=2 python train.py configs/shakespeare_5min.py
#   python sample.py --out_dir out-shakespeare-5min --start "ROMEO:"
#
# Current figure: 1.4552 and 1.4495 on the whole val split (seeds 1337, 1) in 5m00s, AMD EPYC Zen 4
# (bfloat16), torch 2.13.0+cpu, 2026-12-07; AVX2 kernels (float32): 1.4738, 1.4736. benchmarks/LOG.md.

from configs.shakespeare_10min import *  # noqa: F401,F403 (every setting of the ten-minute config)

out_dir = "out-shakespeare-5min"
time_budget = 585.0  # CPU seconds of steps, both threads' (~290 s of wall time for them)
