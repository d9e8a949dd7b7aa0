"""The model's parts outside model.py: its shapes (shapes.py, imports only model.py), loading a
checkpoint into a GPT, LoRA adapters, and lab.py's parameter report."""
