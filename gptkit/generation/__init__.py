"""Generation: sample.py's loop over model.py's KV cache, the sampling rules, the chat session."""
