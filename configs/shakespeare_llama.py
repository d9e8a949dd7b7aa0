# The quick start's recipe with LLaMA's block (SwiGLU, no QK-norm, no soft-cap), so that the
# model exports to llama.cpp, Ollama and LM Studio as plain `llama` (docs/gguf.md).
#
#   python train.py configs/shakespeare_llama.py
#   python convert.py out-shakespeare-llama shakespeare.gguf --to gguf
#   python sample.py --out_dir out-shakespeare-llama --start "ROMEO:"
#
# Figure: val loss 1.845 at --max_iters=400 (docs/gguf.md); history: benchmarks/LOG.md.

out_dir = "out-shakespeare-llama"
dataset = "shakespeare_char"

n_layer = 3
n_head = 4
n_embd = 96
mlp_hidden = 128  # SwiGLU has three matrices: 128 keeps the quick start's MLP size (2 x 96 x 192)
block_size = 64
dropout = 0.0
bias = False
pos_encoding = "rope"
norm = "rmsnorm"
mlp = "swiglu"  # LLaMA's MLP (Shazeer 2020)
zero_init_proj = True
tie_embeddings = False

optimizer = "muon"
muon_lr = 0.03
learning_rate = 3e-3
weight_decay = 0.0
batch_size = 32
gradient_accumulation_steps = 1
max_iters = 1300

lr_schedule = "wsd"
warmup_iters = 40
cooldown_frac = 0.5
min_lr = 0.0

eval_interval = 325
eval_iters = 20
log_interval = 50
