"""The datasets prepare.py, and train.py on first use, build by name.

    python prepare.py shakespeare_char      # Tiny Shakespeare (gptkit/prepare/build.py)
    python prepare.py arithmetic_chat       # conversations of sums (gptkit/prepare/arithmetic.py)
"""

from gptkit.prepare.build import check_dataset_name, prepare_named_dataset


def prepare_named(name, out_dir="data", input_path=None, *, workers=None, progress=True):
    """Prepare the named dataset into out_dir/name; return the folder."""
    check_dataset_name(name)
    if name == "arithmetic_chat":
        from gptkit.prepare.arithmetic import prepare_arithmetic_chat

        return prepare_arithmetic_chat(out_dir, input_path, progress=progress)
    return prepare_named_dataset(name, out_dir, input_path, workers=workers, progress=progress)
