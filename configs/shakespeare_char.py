# nanoGPT's one-GPU "baby GPT" on character-level Tiny Shakespeare (its
# config/train_shakespeare_char.py): 6 layers, 6 heads, 384 wide, context 256.
# nanoGPT reports a val loss of about 1.47 after 5000 iterations (~3 minutes on an
# A100). On a CPU use configs/shakespeare.py instead.
#
#   python train.py configs/shakespeare_char.py
#   python sample.py --out_dir out-shakespeare-char

out_dir = "out-shakespeare-char"
eval_interval = 250  # evaluate often: this small model overfits soon
eval_iters = 200
log_interval = 10
always_save_checkpoint = False  # ckpt.pt only when val improves (best.pt always keeps the best)

wandb_log = False
wandb_project = "shakespeare-char"
wandb_run_name = "mini-gpt"

dataset = "shakespeare_char"
gradient_accumulation_steps = 1
batch_size = 64
block_size = 256  # characters of context

n_layer = 6
n_head = 6
n_embd = 384
dropout = 0.2
bias = False  # nanoGPT's train.py default

learning_rate = 1e-3  # a small model can take a larger rate
max_iters = 5000
# lr_decay_iters follows max_iters (as the Chinchilla paper suggests) unless set here
min_lr = 1e-4  # learning_rate / 10
beta2 = 0.99  # few tokens per step: a slightly shorter second-moment memory
warmup_iters = 100
