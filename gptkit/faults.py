"""Test-only fault injection, read in this one place.

Reliability tests need to make rare things happen on cue. Set the environment
variable GPT_FAULTS to a comma-separated list, e.g.

    GPT_FAULTS=nan_loss_at=5            the training loss becomes NaN at iteration 5
    GPT_FAULTS=inf_grad_at=5            a gradient becomes infinite at iteration 5
    GPT_FAULTS=exit_during_save         the process dies (os._exit) halfway through a checkpoint write
    GPT_FAULTS=sigterm_at=5             the process sends itself SIGTERM at iteration 5 (a stop on cue)
    GPT_FAULTS=exit_during_prepare      prepare.py dies halfway through writing its bins
    GPT_FAULTS=fail_at=3,fail_rank=1    rank 1 raises a RuntimeError in its forward pass at iteration 3
    GPT_FAULTS=fail_at=3,fail_kind=user the same as a UserError (a bad batch), on every rank without fail_rank

Users never need this; it does nothing when the variable is unset.
"""

import os
import signal


def active():
    """The parsed faults: {'nan_loss_at': '5', 'exit_during_save': ''}."""
    spec = os.environ.get("GPT_FAULTS", "")
    out = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        key, _, value = item.partition("=")
        out[key] = value
    return out


def at_step(name, step):
    """True when fault `name=N` is set and `step == N`."""
    value = active().get(name)
    return value is not None and value != "" and int(value) == step


def maybe_exit(name):
    """Die at once, as kill -9 would, when fault `name` is set."""
    if name in active():
        os._exit(137)


def maybe_exit_during_save():
    maybe_exit("exit_during_save")


def maybe_fail(step):
    """Raise the error fault fail_at=N asks for, at iteration N, on fail_rank (default: all)."""
    faults = active()
    if not at_step("fail_at", step):
        return
    if "fail_rank" in faults and faults["fail_rank"] != os.environ.get("RANK", "0"):
        return
    if faults.get("fail_kind") == "user":
        from gptkit.errors import UserError

        raise UserError(f"injected user error at iteration {step} (GPT_FAULTS)")
    raise RuntimeError(f"injected failure at iteration {step} (GPT_FAULTS)")


def maybe_sigterm(step):
    """Send this process SIGTERM at step N (`sigterm_at=N`), as torchrun would forward it."""
    if at_step("sigterm_at", step):
        os.kill(os.getpid(), signal.SIGTERM)
