# Fine-tune GPT-2 (124M) into a chat model on a public conversation set, Hugging Face's
# No Robots (HuggingFaceH4/no_robots: 10,000 conversations written by people, in the
# {"messages": [...]} form). The turn tokens are added after GPT-2's 50,257 ids, their
# rows starting at the mean of the embedding (docs/chat.md). Online, once:
#
#   python prepare.py no_robots          # its Parquet files from the Hub; conversations over 1,025 tokens left out
#   python train.py configs/chat_gpt2.py
#   python sample.py --out_dir out-chat-gpt2 --chat --system "You are a helpful assistant."

out_dir = "out-chat-gpt2"
dataset = "no_robots"
init_from = "gpt2"

eval_interval = 50
eval_iters = 20
log_interval = 5
always_save_checkpoint = False  # keep the best val loss: a small set soon overfits

# 4 windows * 8 micro-batches * 1024 tokens = 32,768 tokens per step, 4.9M in all
# (padding included), on one GPU; not yet measured here (no network on our machines)
batch_size = 4
gradient_accumulation_steps = 8
max_iters = 150

learning_rate = 3e-5  # fine-tuning: a small rate, warmed up, decayed
warmup_iters = 10
min_lr = 3e-6
dropout = 0.0
