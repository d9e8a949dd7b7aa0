# Fine-tune GPT-2 (124M) on Tiny Shakespeare in GPT-2's BPE, nanoGPT's
# config/finetune_shakespeare.py (which starts from gpt2-xl; any of gpt2,
# gpt2-medium, gpt2-large, gpt2-xl or a local Hugging Face folder works here).
#
#   python prepare.py shakespeare
#   python train.py configs/finetune_shakespeare.py
#   python sample.py --out_dir out-shakespeare-gpt2 --start "ROMEO:"

out_dir = "out-shakespeare-gpt2"
eval_interval = 5
eval_iters = 40
log_interval = 1
always_save_checkpoint = False  # keep the checkpoint with the best val loss: it soon overfits

wandb_log = False
wandb_project = "shakespeare"
wandb_run_name = "ft-gpt2"

dataset = "shakespeare"
init_from = "gpt2"

# 1 window * 32 micro-batches * 1024 tokens = 32,768 tokens per step; Shakespeare
# has ~302k tokens, so one step is ~0.1 epoch.
batch_size = 1
gradient_accumulation_steps = 32
max_iters = 20

learning_rate = 3e-5  # fine-tuning: a small, constant rate
decay_lr = False
