# Fine-tune GPT-2 (124M) on Tiny Shakespeare with LoRA (docs/lora.md): rank-8 adapters on
# every block's attention (attn.c_attn), the base frozen; checkpoints hold the adapters only.
#
#   python prepare.py shakespeare
#   python train.py configs/finetune_shakespeare_lora.py        # --init_from=FOLDER offline
#   python sample.py --out_dir out-shakespeare-gpt2-lora --start "ROMEO:"
#   python convert.py out-shakespeare-gpt2-lora hf-shakespeare-lora --to hf   # the merged model
#
# Figures: docs/lora.md (not re-measured this round; history in benchmarks/LOG.md).

out_dir = "out-shakespeare-gpt2-lora"
eval_interval = 10
eval_iters = 40
log_interval = 1
always_save_checkpoint = False  # keep the adapters with the best val loss

wandb_log = False
wandb_project = "shakespeare"
wandb_run_name = "ft-gpt2-lora"

dataset = "shakespeare"
init_from = "gpt2"  # the base: gpt2..gpt2-xl, a local Hugging Face folder, or a ckpt.pt of ours

lora_rank = 8
lora_alpha = 8  # scale alpha / rank = 1, peft's defaults
lora_dropout = 0.05
lora_targets = "attn.c_attn"  # q, k and v: the LoRA paper's and peft's choice for GPT-2

# 4 windows * 8 micro-batches * 1024 tokens = 32,768 tokens per step (~0.1 epoch of
# Shakespeare's ~302k tokens), as configs/finetune_shakespeare.py.
batch_size = 4
gradient_accumulation_steps = 8
max_iters = 60

# Adapters start at zero and are few: they take a rate ~10x full fine-tuning's
# (the LoRA paper trained GPT-2 medium at 2e-4), with a little weight decay
# (0.01, as there), which pulls B A back towards the base.
learning_rate = 3e-4
weight_decay = 0.01
decay_lr = True
lr_schedule = "cosine"
warmup_iters = 5
min_lr = 3e-5
