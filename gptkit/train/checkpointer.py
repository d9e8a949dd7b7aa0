"""Saving a training run: out_dir/ckpt.pt (everything to resume) and out_dir/best.pt
(the weights with the best val loss), rank 0 writing; under FSDP out_dir/ckpt/,
every rank writing its own shard (gptkit/train/sharded.py).

    saver = Checkpointer(out_dir, raw_model, optimizers, scaler, info, dist, device, parallel)
    saver.after_eval(state, improved, always_save=True)  # ckpt.pt, and best.pt when it improved
    saver.save_finished(state, always_save=True)         # ckpt.pt at the last step, before the final evaluation

A checkpoint holds the raw model's state dict (never the DDP or compiled
wrapper's, so no prefixes), the optimizers and GradScaler, every rank's RNG
states, the loop's RunState as top-level keys, and `info`: the model config,
tokenizer, settings, dataset fingerprint and provenance. A LoRA run's holds only
its adapters as the model, plus `lora`: its settings, where its base is and the
base's fingerprint (gptkit/models/lora.py; loaded again by gptkit/models/loading.py), in one
file even under FSDP. Writing is atomic
(gptkit/ops/checkpoint.py); nothing non-finite is ever written.
"""

import dataclasses

import torch

from gptkit.models import lora
from gptkit.ops.checkpoint import save_checkpoint
from gptkit.ops.errors import PeerFailed, RunFailed
from gptkit.train import distributed
from gptkit.run_state import provenance, rng_state


def run_info(model_cfg, meta, settings, dataset, device, is_main):
    """What every checkpoint of this run holds beside the weights and the loop's state: the
    model config, the tokenizer, the settings as run, the data's fingerprint, provenance,
    and a chat dataset's turn tokens (sample.py --chat and the exports read them)."""
    info = {"model_config": dataclasses.asdict(model_cfg), "tokenizer": meta["tokenizer"],
            "config": settings, "data_fingerprint": meta.get("fingerprint"), "dataset": dataset,
            "provenance": provenance(device) if is_main else None}
    if "chat" in meta:
        info["chat"] = meta["chat"]
    return info


class Checkpointer:
    def __init__(self, out_dir, raw_model, optimizers, scaler, info, dist, device, parallel, resumed_at=None):
        self.out_dir, self.raw_model, self.optimizers, self.scaler = out_dir, raw_model, optimizers, scaler
        self.info, self.dist, self.device, self.fsdp = info, dist, device, parallel == "fsdp"
        self.lora = getattr(raw_model, "lora_spec", None)  # a LoRA run saves its adapters only
        # A LoRA run's adapters are small enough to gather into one file even under FSDP.
        self.sharded = self.fsdp and self.lora is None
        self.path = out_dir / ("ckpt" if self.sharded else "ckpt.pt")
        self.last_iter = resumed_at  # the iteration of the newest checkpoint this run can fall back to

    def save(self, kind, state):
        """kind "ckpt" (to resume) or "best" (weights only). A collective: every rank calls it."""
        run = {**self.info, **dataclasses.asdict(state)}
        if self.sharded:
            from gptkit.train import sharded  # FSDP only: torch's DCP is slow to import

            sharded.save(kind, self.out_dir, self.raw_model, self.optimizers, run, self.device, self.dist)
        else:
            self._save_file(kind, run)
        if kind == "ckpt":
            self.last_iter = state.iter_num

    def _save_file(self, kind, run):
        rngs = distributed.gather_objects({"torch": torch.get_rng_state(), "cuda": rng_state(self.device)["cuda"]}, self.dist)
        weights = lora.adapter_state_dict(self.raw_model) if self.lora else self.raw_model.state_dict()
        optimizer = None
        if self.fsdp:  # a LoRA run under FSDP: every rank joins in gathering the adapters and their moments
            weights = {k: v.full_tensor().cpu() for k, v in weights.items()}
            from gptkit.train import sharded

            optimizer = sharded.optimizer_states_by_index(self.raw_model, self.optimizers) if kind == "ckpt" else None
        elif kind == "ckpt" and self.dist.is_main:
            optimizer = [opt.state_dict() for opt in self.optimizers]
        if not self.dist.is_main:
            return
        obj = {"format_version": 1, "model": weights, **run}
        if self.lora:
            obj["lora"] = self.lora  # its settings, and where the base is and its fingerprint
        if kind == "ckpt":
            obj["optimizer"] = optimizer
            obj["scaler"] = self.scaler.state_dict() if self.scaler.is_enabled() else None
            obj["rng"] = {**rng_state(self.device), "per_rank": rngs if self.dist.world_size > 1 else None}
        save_checkpoint(obj, self.out_dir / f"{kind}.pt")

    def save_finished(self, state, always_save):
        """Save ckpt at the last iteration, before the final evaluation: an evaluation
        that fails there (out of memory is the common case) loses nothing trained.
        after_eval saves it again with the evaluation's results, as at every eval.
        With always_save=False ckpt holds improvements only (nanoGPT's meaning), so
        the final state waits for the evaluation to say whether it is one."""
        if always_save and state.iter_num > 0 and self.last_iter != state.iter_num:
            self.save("ckpt", state)

    def after_eval(self, state, improved, always_save, keep_start=False):
        """After an evaluation the loop has recorded in `state`: save ckpt.pt (always, or
        when the val loss improved) and best.pt (when it improved). Step 0 is the start,
        not saved; with keep_start (rl.py: its start is a trained chat model) the start is
        best.pt until a step beats it, so a run that only makes it worse keeps it."""
        if state.iter_num > 0 and (improved or always_save):
            self.save("ckpt", state)
        if improved and (state.iter_num > 0 or keep_start):
            self.save("best", state)

    def failed(self, what):
        """The error that ends a run gone non-finite: rank 0 reports it with the last good
        checkpoint and what to try; the other ranks (which got here alike) stop quietly."""
        if not self.dist.is_main:
            return PeerFailed()
        where = f"{self.path} (iteration {self.last_iter})" if self.last_iter is not None else "none saved yet in this run"
        return RunFailed(f"{what}. Last good checkpoint: {where}. Try a lower learning_rate or muon_lr, "
                         "grad_clip, or dtype=bfloat16/float32")
