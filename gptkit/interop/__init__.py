"""Other projects' formats: Hugging Face GPT-2 weights, nanoGPT checkpoints."""
