"""Evaluation: scoring a model on text (sliding windows, bits per byte), the standard tasks
and their report card, HellaSwag, eval.py's comparisons and plots."""
