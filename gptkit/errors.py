"""User-facing errors and the one place that turns them into exit codes.

Library code raises `UserError` for mistakes a user can fix (a bad setting, a
missing file). Only a script's `main` is wrapped by `run_main`, which prints
the message without a traceback and exits with a documented code:

    0    success (also a clean stop on SIGINT/SIGTERM with a checkpoint saved)
    1    the run failed (for example a non-finite loss)
    2    a user mistake: the message says what is wrong and what to do
    130  interrupted by Ctrl-C before anything could be saved
"""

import os
import sys

EXIT_FAILED = 1
EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130


class UserError(Exception):
    """A mistake in the user's input; the message names the thing and the fix."""


class RunFailed(Exception):
    """The run itself went wrong (e.g. a NaN loss); the message says where."""


def run_main(main, argv=None):
    """Call `main(argv)` and exit with its code, turning our errors into messages."""
    try:
        code = main(argv)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        code = EXIT_USER_ERROR
    except RunFailed as e:
        print(f"error: {e}", file=sys.stderr)
        code = EXIT_FAILED
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = EXIT_INTERRUPTED
    except BrokenPipeError:  # output piped into `head` that has closed: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 0
    sys.exit(code or 0)
