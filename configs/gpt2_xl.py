# GPT-2 XL (1.56B parameters) on one node of 8 GPUs with 24 GB each, sharded with FSDP2
# (DDP would need ~25 GB per GPU for weights, gradients and AdamW's moments: docs/scaling.md).
#
#   python prepare.py openwebtext
#   torchrun --standalone --nproc_per_node=8 train.py configs/gpt2_xl.py
#   python -c "from gptkit.train.sharded import sharded_to_single as f; f('out-gpt2-xl', 'out-gpt2-xl/ckpt.pt')"
#
# Not measured here (no GPU node): memory estimated in docs/scaling.md. If it runs out of
# memory: --activation_checkpointing=true, or --batch_size=2 with twice the accumulation.

out_dir = "out-gpt2-xl"
wandb_log = False
wandb_project = "owt"
wandb_run_name = "gpt2-xl-1.5B"

parallel = "fsdp"
activation_checkpointing = False

dataset = "openwebtext"
batch_size = 4
block_size = 1024
gradient_accumulation_steps = 15 * 8  # global count: 15 per GPU on 8 GPUs; 491,520 tokens a step, as configs/gpt2.py

n_layer = 48
n_head = 25
n_embd = 1600
dropout = 0.0
bias = True
pad_vocab_multiple = 64

# GPT-3's 1.3B model (Brown et al. 2020, table 2.1) trained at 2e-4; ~30B tokens
# (20 per parameter, Hoffmann et al. 2022) are ~60k steps of 0.49M tokens.
learning_rate = 2e-4
max_iters = 60000
lr_decay_iters = 60000
min_lr = 2e-5
warmup_iters = 2000
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0

eval_interval = 1000
eval_iters = 100
log_interval = 10

dtype = "auto"  # bfloat16: FSDP gathers bf16 weights, reduces gradients in fp32
compile = True
