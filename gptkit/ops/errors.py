"""User-facing errors and the one place that turns them into exit codes.

Library code raises `UserError` for mistakes a user can fix (a bad setting, a
missing file). Only a script's `main` is wrapped by `run_main`, which prints
the message without a traceback and exits with a documented code:

    0    success (also a clean stop on SIGINT/SIGTERM with a checkpoint saved)
    1    the run failed (for example a non-finite loss)
    2    a user mistake: the message says what is wrong and what to do
    130  interrupted by Ctrl-C before anything could be saved

Under torchrun every rank runs `main`. A mistake that every rank makes alike (a
bad setting) is printed by rank 0 alone; an error only one rank hits is printed
by that rank; a rank that stops because another one failed prints nothing. Each
message also goes to the file torchrun names in TORCHELASTIC_ERROR_FILE, so that
its closing summary shows our one line as the root cause instead of a pointer to
its documentation.
"""

import argparse
import contextlib
import json
import os
import signal
import sys
import time

EXIT_FAILED = 1
EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130
QUIET_RANK_WAIT_S = 10  # a rank that leaves an error every rank makes to rank 0 waits this long at most


def first_line(error, limit=300):
    """The first line of an exception's message, cut to `limit` characters, or its
    type's name when it says nothing: what a one-line error quotes of a cause."""
    text = str(error).strip()
    return text.splitlines()[0][:limit] if text else type(error).__name__


class UserError(Exception):
    """A mistake in the user's input; the message names the thing and the fix."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose mistakes are a UserError: one line through run_main (exit 2),
    instead of argparse's usage text and its own exit."""

    def error(self, message):
        raise UserError(f"{message} (see python {self.prog} --help)")


class RunFailed(Exception):
    """The run itself went wrong (e.g. a NaN loss); the message says where."""


class PeerFailed(Exception):
    """Another rank failed (and says why); this one stops quietly with exit code 1.

    With a message (a peer that left: killed without a word, its node lost, or with an
    error it printed itself), the message goes to torchrun's summary only, where it
    replaces a bare exit code 1; the console keeps the failed rank's own line alone."""


def same_on_every_rank(error):
    """Mark `error` as one every rank raises alike (settings, shared files): only rank 0 prints it."""
    error.same_on_every_rank = True
    return error


def _rank():
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def _tell_torchrun(message):
    """Leave the message where torchrun's failure summary looks for it."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    # Written beside it and renamed into place: torchrun reads the file of every rank that
    # has failed, and a file caught between open("w")'s truncation and the write is empty,
    # which its JSON reader answers with a traceback instead of the summary.
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump({"message": message, "timestamp": int(time.time())}, f)
        os.replace(tmp, path)
    except OSError:  # the summary then just lacks our line
        with contextlib.suppress(OSError):
            os.remove(tmp)


def _out_of_memory(e):
    """MemoryError (numpy, Python) or torch's CPU/GPU allocation failures."""
    text = str(e).lower()
    signs = ("not enough memory", "can't allocate memory", "cannot allocate memory", "out of memory")
    return isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError" or any(s in text for s in signs)


# What requirements.txt installs (and the optional packages some commands import): an
# ImportError naming one of them is a setup to fix, said in one line, not a traceback.
REQUIREMENTS = ("torch", "numpy", "tiktoken", "rustbpe", "tqdm", "wandb", "safetensors", "gguf", "matplotlib",
                "transformers", "peft", "llama_cpp", "starlette", "uvicorn")


def missing_requirement(error):
    """The one line for an ImportError of a package this project needs, else None."""
    name = (getattr(error, "name", None) or "").partition(".")[0]
    if not isinstance(error, ImportError) or name not in REQUIREMENTS:
        return None
    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "this command"
    return (f"error: {prog} needs {name}, which cannot be imported here ({first_line(error, 120)}): "
            "install the requirements, pip install -r requirements.txt")


def quiet_start():
    """Called by a root script before its heavy imports (torch, numpy): a Ctrl-C while
    they load is "interrupted" (exit 130) and a missing requirement one line naming it
    (exit 2), as run_main says them once main runs, instead of a traceback."""
    previous = sys.excepthook

    def hook(kind, error, traceback):
        line = "interrupted" if issubclass(kind, KeyboardInterrupt) else missing_requirement(error)
        if line is None:
            return previous(kind, error, traceback)
        print(line, file=sys.stderr)
        sys.stderr.flush()
        os._exit(EXIT_INTERRUPTED if line == "interrupted" else EXIT_USER_ERROR)

    sys.excepthook = hook


def catch_ctrl_c():
    """Make Ctrl-C raise KeyboardInterrupt in this process, even when SIGINT came in
    ignored (a launcher, or `cmd &` in a script, starts a program that way): our
    scripts handle it (exit 130, temporary files removed), and a user's Ctrl-C must
    work. Returns the previous handler. Handlers live in the main thread only."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGINT, signal.default_int_handler)


def run_main(main, argv=None):
    """Call `main(argv)` and exit with its code, turning our errors into messages."""
    catch_ctrl_c()
    try:
        code = main(argv)
    except (UserError, RunFailed) as e:
        message = f"error: {e}"
        rank = _rank()
        if rank != 0 and not getattr(e, "same_on_every_rank", False):
            message = f"error on rank {rank}: {e}"
        quiet = rank != 0 and getattr(e, "same_on_every_rank", False)
        if not quiet:
            print(message, file=sys.stderr)
        _tell_torchrun(message)
        code = EXIT_USER_ERROR if isinstance(e, UserError) else EXIT_FAILED
        if quiet:
            # Let rank 0 print it: torchrun ends every worker as soon as one exits, and a
            # quiet rank that left first would take rank 0's message with it. Rank 0 meets
            # the same error in about the same time; torchrun ends this wait when it exits.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # its SIGTERM ends the wait at once
            time.sleep(QUIET_RANK_WAIT_S)
    except PeerFailed as e:
        if str(e):
            _tell_torchrun(f"error on rank {_rank()}: {e}")
        code = EXIT_FAILED
    except ImportError as e:
        line = missing_requirement(e)
        if line is None:
            raise
        print(line, file=sys.stderr)
        code = EXIT_USER_ERROR
    except (MemoryError, RuntimeError) as e:
        if not _out_of_memory(e):
            raise
        first = first_line(e, 200)
        print(f"error: out of memory ({first}): use a smaller batch_size, block_size, num_samples or model", file=sys.stderr)
        _tell_torchrun(f"error: out of memory ({first})")
        code = EXIT_FAILED
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = EXIT_INTERRUPTED
    except BrokenPipeError:  # output piped into `head` that has closed: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 0
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        # A torchrun worker leaves without Python's shutdown, whose clean-up of gloo's
        # threads can abort a finished run ("terminate called without an active
        # exception", SIGABRT: 1 of ~780 runs in CI). Our files are all closed by now.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code or 0)
    sys.exit(code or 0)
