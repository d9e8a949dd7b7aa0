"""Test-only fault injection, read in this one place.

Reliability tests need to make rare things happen on cue. Set the environment
variable GPT_FAULTS to a comma-separated list, e.g.

    GPT_FAULTS=nan_loss_at=5            the training loss becomes NaN at iteration 5
    GPT_FAULTS=inf_grad_at=5            a gradient becomes infinite at iteration 5
    GPT_FAULTS=exit_during_save         the process dies (os._exit) halfway through a checkpoint write
    GPT_FAULTS=sigterm_at=5             the process sends itself SIGTERM at iteration 5 (a stop on cue)
    GPT_FAULTS=exit_during_prepare      prepare.py dies halfway through writing its bins
    GPT_FAULTS=sigterm_during_prepare   prepare.py sends itself SIGTERM there instead
    GPT_FAULTS=sigterm_during_commit    prepare.py sends itself SIGTERM between its renames
    GPT_FAULTS=exit_after_first_file    prepare.py openwebtext|fineweb_edu dies once a file is tokenized
    GPT_FAULTS=fail_at=3,fail_rank=1    rank 1 raises a RuntimeError in its forward pass at iteration 3
    GPT_FAULTS=fail_at=3,fail_kind=user the same as a UserError (a bad batch), on every rank without fail_rank
    GPT_FAULTS=kill_at=6,kill_rank=1    rank 1 SIGKILLs itself at iteration 6, in torchrun's first attempt
                                        only (TORCHELASTIC_RESTART_COUNT unset or 0): the restart runs on
    GPT_FAULTS=kill_at=6,kill_once=F    the same, once for the whole job: only the process that creates
                                        file F dies (the restart count is per node: pytorch/pytorch#108158)
    GPT_FAULTS=hold_at=6,hold_rank=1,hold=F   rank 1 writes its pid to file F at iteration 6 and waits
                                        to be killed from outside (once for the whole job: only
                                        the process that creates F waits)
    GPT_FAULTS=hold_during_save=8,hold=F  the same halfway through writing iteration 8's checkpoint
    GPT_FAULTS=join_delay=2,join_rank=1 rank 1 waits 2 s before joining the process group (a slow
                                        start: a loaded machine, a slow disk)
    GPT_FAULTS=token_delay=0.05         serve.py's worker waits 50 ms after each token (a slow model on cue)

Users never need this; it does nothing when the variable is unset. The training
faults are hooks that `install` puts on the model once at set-up, so the training
step itself carries no fault-injection code.
"""

import math
import os
import signal
import time


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


def maybe_sigterm(name):
    """Send this process SIGTERM (a stop on cue) when fault `name` is set."""
    if name in active():
        os.kill(os.getpid(), signal.SIGTERM)


def maybe_exit_during_save(iter_num=None):
    """exit_during_save: die halfway through any checkpoint write; hold_during_save=N: wait
    there to be killed (see hold), in a write of iteration N's checkpoint (N empty: any)."""
    maybe_exit("exit_during_save")
    wanted = active().get("hold_during_save")
    if wanted is not None and (wanted == "" or iter_num is not None and int(wanted) == iter_num):
        hold()


def hold():
    """Write this process's pid to the file `hold=F` names, if this process creates it
    (once for the whole job), and wait up to 10 minutes to be killed from outside."""
    try:
        fd = os.open(active()["hold"], os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.write(fd, f"{os.getpid()}\n".encode())
    os.close(fd)
    time.sleep(600)


def maybe_fail(step):
    """Raise the error fault fail_at=N asks for, at iteration N, on fail_rank (default: all)."""
    faults = active()
    if not at_step("fail_at", step):
        return
    if "fail_rank" in faults and faults["fail_rank"] != os.environ.get("RANK", "0"):
        return
    if faults.get("fail_kind") == "user":
        from gptkit.ops.errors import UserError

        raise UserError(f"injected user error at iteration {step} (GPT_FAULTS)")
    raise RuntimeError(f"injected failure at iteration {step} (GPT_FAULTS)")


def maybe_kill(step):
    """SIGKILL this process (no clean-up, no message: as the OOM killer or a lost node
    would) at iteration kill_at=N, on kill_rank (default: all), in the first attempt."""
    faults = active()
    if not at_step("kill_at", step):
        return
    if "kill_rank" in faults and faults["kill_rank"] != os.environ.get("RANK", "0"):
        return
    if "kill_once" in faults:  # a file: the first process to create it dies, no later one
        try:
            os.close(os.open(faults["kill_once"], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
    elif os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return  # torchrun restarted the job: this attempt runs on
    os.kill(os.getpid(), signal.SIGKILL)


def maybe_hold(step):
    """hold_at=N (on hold_rank, default: all): wait at iteration N to be killed (see hold)."""
    faults = active()
    if at_step("hold_at", step) and faults.get("hold_rank", os.environ.get("RANK", "0")) == os.environ.get("RANK", "0"):
        hold()


def maybe_delay_join():
    """join_delay=S (on join_rank, default: all): wait S seconds before joining the process group."""
    faults = active()
    if faults.get("join_delay") and faults.get("join_rank", os.environ.get("RANK")) == os.environ.get("RANK"):
        time.sleep(float(faults["join_delay"]))


def token_delay():
    """Seconds serve.py's worker waits after each token (fault token_delay=S), else 0."""
    return float(active().get("token_delay") or 0)


def install(model, iteration):
    """Put the training faults GPT_FAULTS asks for on `model` (the raw model, before
    DDP or compile wrap it); `iteration()` is the training loop's current iteration.
    Training forward passes only (model.training): evaluations are left alone.

    sigterm_at=N    SIGTERM to this process in iteration N's first forward pass
    fail_at=N       an error raised after iteration N's forward pass (see maybe_fail)
    nan_loss_at=N   iteration N's loss becomes NaN
    inf_grad_at=N   the first parameter's gradient becomes infinite in iteration N
                    (one process: DDP and FSDP write the reduced gradients themselves)
    kill_at=N       SIGKILL to this process in iteration N's first forward pass, on
                    kill_rank (default: all), in torchrun's first attempt only (or,
                    with kill_once=FILE, in the one process that creates FILE)
    hold_at=N       wait there to be killed from outside (see hold)"""
    faults = active()
    if not any(k in faults for k in ("sigterm_at", "fail_at", "nan_loss_at", "inf_grad_at", "kill_at", "hold_at")):
        return
    signalled = set()

    def after_forward(module, args, output):
        if not module.training:
            return None
        step = iteration()
        if at_step("sigterm_at", step) and step not in signalled:
            signalled.add(step)
            os.kill(os.getpid(), signal.SIGTERM)  # as torchrun forwards it: the step still completes
        maybe_kill(step)
        maybe_hold(step)
        maybe_fail(step)
        if at_step("nan_loss_at", step):
            logits, loss = output
            return logits, loss * float("nan")
        return None

    def after_grad(param):
        if at_step("inf_grad_at", iteration()):
            param.grad.fill_(math.inf)

    model.register_forward_hook(after_forward)
    next(p for p in model.parameters() if p.requires_grad).register_post_accumulate_grad_hook(after_grad)
