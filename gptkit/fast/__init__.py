"""The fast parts: faster modules swapped into model.py's built model (NumPy and int8
products, hand-written backward, compiled decoding), each checked against the module it
replaces. Skip on a first read."""
