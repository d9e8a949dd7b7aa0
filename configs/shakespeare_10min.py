# Character-level Tiny Shakespeare in ten minutes of wall time on a 2-core machine: the
# 1200-CPU-second recipe (configs/shakespeare_1200cpus.py) at two threads, which spend about
# two CPU seconds a wall second (a step in ~0.6 of one thread's wall time, measured).
#
#   OMP_NUM_THREADS=2 python train.py configs/shakespeare_10min.py
#   python sample.py --out_dir out-shakespeare-10min --start "ROMEO:"
#
# Current figure: 1.4376 and 1.4361 on the whole val split (seeds 1337, 1) in 10m07s and 9m55s, AMD EPYC
# Zen 4 (bfloat16), torch 2.13.0+cpu, 2026-12-07; AVX2 kernels (float32): 1.4669, 1.4687. benchmarks/LOG.md.

from configs.shakespeare_1200cpus import *  # noqa: F401,F403 (its shape, optimizer, schedule, dtype by CPU)

out_dir = "out-shakespeare-10min"
time_budget = 1170.0  # CPU seconds of steps, both threads' (~585 s of wall time for them)
max_iters = 10000  # the budget ends the run first
