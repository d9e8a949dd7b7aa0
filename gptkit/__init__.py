"""gptkit: the parts the scripts at the repository root are built of.

Data preparation (gptkit.prepare), reading a prepared dataset (gptkit.data.dataset),
tokenizers, checkpoints, the training loop's parts (gptkit.train), generation and
sampling, and other projects' formats (gptkit.interop). The GPT itself is model.py
at the root, the file to read first. Importing this package does nothing: no
device detection, no downloads, no output.
"""
