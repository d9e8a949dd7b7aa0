# GPT-2 small (124M) on a large web corpus, nanoGPT's config/train_gpt2.py: one node
# of 8 GPUs, ~0.5M tokens per step (12 windows * 1024 tokens * 40 micro-batches),
# 600k steps (~300B tokens). nanoGPT reaches a val loss of ~2.85 on OpenWebText.
#
#   python prepare.py openwebtext    # downloads OpenWebText's Parquet files, tokenizes them (docs/data.md)
#   torchrun --standalone --nproc_per_node=8 train.py configs/gpt2.py
#
# Turn on wandb_log to follow the run in Weights & Biases (needs `pip install wandb`).

out_dir = "out-gpt2"
wandb_log = False
wandb_project = "owt"
wandb_run_name = "gpt2-124M"

dataset = "openwebtext"
batch_size = 12
block_size = 1024
gradient_accumulation_steps = 5 * 8  # global count: 5 per GPU on 8 GPUs

n_layer = 12
n_head = 12
n_embd = 768
dropout = 0.0
bias = True  # as GPT-2 (nanoGPT's train.py turns it off: slightly faster, 124.37M)
pad_vocab_multiple = 64  # 50257 -> 50304 ids: matmuls on multiples of 64 run faster

learning_rate = 6e-4
max_iters = 600000
min_lr = 6e-5
warmup_iters = 2000
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0

eval_interval = 1000
eval_iters = 200
log_interval = 10

dtype = "auto"  # bfloat16 on A100/H100
compile = True
