# A model that uses a calculator, offline, on a CPU: a small character-level model learns to
# answer "What is 1234*5678?" by calling the calculator and copying its output, and is
# measured on products it never saw asked (docs/chat.md, "Tool calls").
#
#   python train.py configs/chat_multiply_tools.py       # prepares data/multiply_tools first
#   python eval.py out-chat-multiply --dataset multiply_tools --answers calculator   # or none
#
# Current figure: 100% of 2,000 held-out products with the calculator, 0% without it, 0% for
# the same steps on multiply_plain; 2026-12-07, AMD EPYC Zen 4, torch 2.13.0+cpu (BENCHMARKS.md).

from configs.chat_arithmetic import *  # noqa: F401,F403 (the arithmetic chat recipe's model and schedule)

out_dir = "out-chat-multiply"
dataset = "multiply_tools"
block_size = 64  # a conversation with its call and output is 52 tokens
