"""The training loop's parts: the starting model, optimizers, distributed set-up, logging, run state, MFU."""
