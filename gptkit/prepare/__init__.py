"""Data preparation: reading inputs, the first pass and split, parallel encoding, the dataset folder."""
