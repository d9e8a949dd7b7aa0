"""The sizes pipeline.py runs: each stage's settings, stated once, here.

A model's token embedding and output layer hold 2 x vocab x n_embd parameters. With
GPT-2's 50,257 tokens a laptop model (n_embd 256) would be ~90% vocabulary, so the
two small sizes train our own BPE (prepare.py --tokenizer bpe) at a vocabulary that
leaves the blocks most of the parameters; the GPU size (GPT-2 124M's shape) can
afford a large one.

The architecture is LLaMA's (RoPE, RMSNorm, SwiGLU, no biases, untied), the one that
exports both to Hugging Face (LlamaForCausalLM) and to llama.cpp (docs/export.md).

`expected_s`: the wall seconds each stage is expected to take (docs/pipeline.md says
how they were found); the progress line's ETA starts from them and corrects them by
how fast this machine ran the stages already done.
"""

LLAMA = {"pos_encoding": "rope", "norm": "rmsnorm", "mlp": "swiglu", "bias": False, "tie_embeddings": False,
         "dropout": 0.0}

SIZES = {
    # For the test suite: every stage runs, in about a minute of CPU on 2 cores.
    "tiny": {
        "vocab_size": 320,
        "model": {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 64},
        "pretrain": {"batch_size": 8, "gradient_accumulation_steps": 1, "max_iters": 20, "learning_rate": 3e-3,
                     "min_lr": 3e-4, "warmup_iters": 2, "eval_interval": 10, "eval_iters": 2, "log_interval": 5},
        "sft": {"batch_size": 8, "gradient_accumulation_steps": 1, "max_iters": 10, "learning_rate": 3e-3,
                "min_lr": 3e-4, "warmup_iters": 2, "eval_interval": 10, "eval_iters": 2, "log_interval": 5},
        "rl": {"group_size": 4, "prompts_per_step": 2, "max_new_tokens": 6, "max_iters": 2, "eval_interval": 2,
               "eval_prompts": 8, "log_interval": 1, "batch_size": 8, "learning_rate": 3e-4},
        "card_tokens": 2048,  # eval.py --max_tokens for the card's bits per byte
        "expected_s": {"corpus": 5, "pretrain": 10, "card": 8, "chat_data": 6, "sft": 8, "rl": 8, "card_after": 8,
                       "export": 8, "report": 5},
    },
    # A laptop's half hour on 2 CPU cores: the two training stages end on a budget of CPU
    # seconds (train.py --time_budget, its own clock); measured end to end on 2026-12-07:
    # 25m37s wall (docs/pipeline.md).
    "laptop": {
        "vocab_size": 2048,
        "model": {"n_layer": 4, "n_head": 4, "n_embd": 192, "block_size": 128},
        "pretrain": {"batch_size": 32, "gradient_accumulation_steps": 1, "max_iters": 20000, "time_budget": 2400,
                     "learning_rate": 1e-3, "min_lr": 1e-4, "warmup_iters": 50, "eval_interval": 250,
                     "eval_iters": 10, "log_interval": 25},
        "sft": {"batch_size": 32, "gradient_accumulation_steps": 1, "max_iters": 5000, "time_budget": 480,
                "learning_rate": 1e-3, "min_lr": 1e-4, "warmup_iters": 20, "eval_interval": 100, "eval_iters": 10,
                "log_interval": 25},
        # 3e-5: at 3e-4 (the character recipe's rate) AdamW's first step, a step of ~lr on
        # every weight, took this model from 100% to 0% of held-out sums (benchmarks/LOG.md)
        "rl": {"group_size": 8, "prompts_per_step": 8, "max_new_tokens": 6, "max_iters": 40, "eval_interval": 20,
               "eval_prompts": 100, "log_interval": 5, "batch_size": 64, "learning_rate": 3e-5},
        "card_tokens": 0,  # 0: the whole val split
        "card_limit": 200,  # eval.py --limit: each task's first 200 items
        "expected_s": {"corpus": 5, "pretrain": 1250, "card": 90, "chat_data": 5, "sft": 270, "rl": 20,
                       "card_after": 90, "export": 10, "report": 5},
    },
    # GPT-2 124M's shape on a node of GPUs (documented, not measured here): run it with
    # --corpus fineweb_edu --shards N --nproc_per_node 8.
    "gpu": {
        "vocab_size": 32768,
        "model": {"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 1024},
        "pretrain": {"batch_size": 16, "gradient_accumulation_steps": 32, "max_iters": 10000, "learning_rate": 6e-4,
                     "min_lr": 6e-5, "warmup_iters": 500, "eval_interval": 1000, "eval_iters": 50,
                     "log_interval": 50},
        "sft": {"batch_size": 32, "gradient_accumulation_steps": 1, "max_iters": 1500, "learning_rate": 1e-4,
                "min_lr": 1e-5, "warmup_iters": 50, "eval_interval": 500, "eval_iters": 50, "log_interval": 50},
        "rl": {"group_size": 16, "prompts_per_step": 32, "max_new_tokens": 6, "max_iters": 300, "eval_interval": 100,
               "eval_prompts": 400, "log_interval": 25, "batch_size": 64, "learning_rate": 1e-5},
        "card_tokens": 10_000_000,
        "card_limit": 0,  # every item
        "expected_s": {"corpus": 1800, "pretrain": 5400, "card": 600, "chat_data": 30, "sft": 600, "rl": 900,
                       "card_after": 600, "export": 120, "report": 30},
    },
}
