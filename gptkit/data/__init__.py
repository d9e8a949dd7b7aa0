"""The data a training step reads: the token bins and batches, chat conversations and their
template, tokenizers, rl.py's prompts and pairs. Read dataset.py with train.py."""
