"""Settings: typed dataclasses filled from a config file and the command line.

Every script declares its settings as dataclass fields with `setting(default,
help)`. `parse_settings` then reads nanoGPT-style arguments:

    python train.py configs/shakespeare.py --max_iters=100 --compile false

A config file is plain Python assignments, run in a namespace of its own (never
into our globals). Every name it assigns and every `--key` must be a known
setting: a typo is an error that suggests the closest name, never silently
ignored. Values are checked against the field's type; each dataclass's
`__post_init__` may raise ValueError for impossible combinations, which is
reported the same way.
"""

import dataclasses
import difflib
import decimal
import runpy
import sys
import types
import typing

from gptkit.ops.errors import UserError


def setting(default, help):
    """A dataclass field with a default and a one-line description for --help."""
    return dataclasses.field(default=default, metadata={"help": help})


def choice_problems(cfg, choices):
    """One message per field of `cfg` whose value is not among `choices[name]`."""
    return [
        f"{name}={getattr(cfg, name)!r} must be one of {', '.join(allowed)}"
        for name, allowed in choices.items()
        if getattr(cfg, name) not in allowed
    ]


def read_config_file(path):
    """Run a config file in its own namespace; return the names it assigned."""
    try:
        namespace = runpy.run_path(str(path))
    except FileNotFoundError:
        raise UserError(f"config file {path} does not exist")
    except SyntaxError as e:
        raise UserError(f"config file {path}, line {e.lineno}: {e.msg}")
    except Exception as e:  # the file is user code: any error in it is the user's to fix
        raise UserError(f"config file {path} failed to run: {type(e).__name__}: {e}")
    return {
        name: value
        for name, value in namespace.items()
        if not name.startswith("_")
        and not isinstance(value, (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type))
    }


def _field_types(cls):
    """Field name -> resolved type (works with `from __future__ import annotations`)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _unwrap_optional(tp):
    """(inner type, allows None) for `X`, `X | None` or `Optional[X]`."""
    args = typing.get_args(tp)
    if type(None) in args:
        inner = [a for a in args if a is not type(None)]
        return inner[0], True
    return tp, False


def _type_name(tp):
    inner, optional = _unwrap_optional(tp)
    name = getattr(inner, "__name__", str(inner))
    return f"{name} or none" if optional else name


def parse_value(text, tp):
    """Parse a command-line string into the field's type; ValueError if it can't."""
    inner, optional = _unwrap_optional(tp)
    if optional and text.lower() in ("none", "null"):
        return None
    if inner is bool:
        lowered = text.lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        raise ValueError("expected true/false/1/0")
    if inner is int:
        try:
            return int(text)  # exact at any size: 9007199254740993 is not rounded to ...992 as a float would be
        except ValueError:
            pass
        try:
            exact = decimal.Decimal(text.strip())  # also 5e3 for 5000, exactly (a float rounds past 2**53)
        except decimal.InvalidOperation:
            raise ValueError("expected an integer") from None
        if not exact.is_finite() or exact.adjusted() > 4300 or exact != exact.to_integral_value():
            raise ValueError("expected an integer")
        return int(exact)
    if inner is float:
        try:
            return float(text)
        except ValueError:
            raise ValueError("expected a number") from None
    return text


def check_value(value, tp):
    """True when a value from a config file fits the field's type."""
    inner, optional = _unwrap_optional(tp)
    if value is None:
        return optional
    if inner is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if inner is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, inner)


# Names other trainers (Hugging Face's Trainer, PyTorch examples, LLaMA configs) use for our
# settings: too far from ours in spelling for difflib to find.
ALIASES = {
    "lr": "learning_rate", "steps": "max_iters", "max_steps": "max_iters", "iters": "max_iters",
    "warmup_steps": "warmup_iters", "wd": "weight_decay", "bs": "batch_size",
    "grad_accum": "gradient_accumulation_steps", "gradient_accumulation": "gradient_accumulation_steps",
    "seq_len": "block_size", "context_length": "block_size", "max_seq_len": "block_size",
    "num_layers": "n_layer", "num_heads": "n_head", "d_model": "n_embd", "hidden_size": "n_embd",
    "clip": "grad_clip", "max_grad_norm": "grad_clip", "save_dir": "out_dir", "output_dir": "out_dir",
}


def _did_you_mean(name, known):
    alias = ALIASES.get(name)
    if alias in known:
        return f" (did you mean '{alias}'?)"
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def format_help(classes, prog, description=""):
    lines = [f"usage: python {prog} [CONFIG.py] [--key=value | --key value ...]", ""]
    if description:
        lines += [description.strip(), ""]
    for cls in classes:
        title = (cls.__doc__ or cls.__name__).strip().splitlines()[0]
        lines.append(f"{title}:")
        types_ = _field_types(cls)
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else "(required)"
            lines.append(f"  --{f.name} ({_type_name(types_[f.name])}, default {default!r})")
            lines.append(f"      {f.metadata.get('help', '')}")
        lines.append("")
    return "\n".join(lines)


def split_argv(argv):
    """(config file or None, [(key, value_text, where)]) from nanoGPT-style argv."""
    config_path, pairs, i = None, [], 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            key = arg[2:]
            if "=" in key:
                key, value = key.split("=", 1)
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                i += 1
                value = argv[i]
            else:
                raise UserError(f"--{key} needs a value: write --{key}=VALUE or --{key} VALUE")
            pairs.append((key.replace("-", "_"), value, f"--{key}"))
        elif config_path is None and arg.endswith(".py"):
            config_path = arg
        else:
            raise UserError(
                f"unexpected argument '{arg}': give at most one CONFIG.py, then --key=value settings"
            )
        i += 1
    return config_path, pairs


def parse_settings(argv, classes, prog=None, description=""):
    """Fill one instance of each dataclass in `classes` from argv; see module doc."""
    argv = sys.argv[1:] if argv is None else list(argv)
    prog = prog or sys.argv[0]
    if "-h" in argv or "--help" in argv:
        print(format_help(classes, prog, description))
        sys.exit(0)

    owner, types_ = {}, {}
    for cls in classes:
        for name, tp in _field_types(cls).items():
            assert name not in owner, f"setting {name} is declared twice"
            owner[name], types_[name] = cls, tp
    known = list(owner)

    config_path, pairs = split_argv(argv)
    values = {}
    if config_path is not None:
        for name, value in read_config_file(config_path).items():
            if name not in owner:
                raise UserError(
                    f"unknown setting '{name}' in {config_path}{_did_you_mean(name, known)}"
                )
            if not check_value(value, types_[name]):
                raise UserError(
                    f"{name} = {value!r} in {config_path}: expected {_type_name(types_[name])}"
                )
            values[name] = value
    for name, text, where in pairs:
        if name not in owner:
            raise UserError(f"unknown setting '{where}'{_did_you_mean(name, known)}")
        try:
            values[name] = parse_value(text, types_[name])
        except ValueError as e:
            raise UserError(f"bad value for {where}: {text!r} ({e})")

    instances = []
    for cls in classes:
        kwargs = {k: v for k, v in values.items() if owner[k] is cls}
        try:
            instances.append(cls(**kwargs))
        except ValueError as e:
            raise UserError(str(e))
    return instances


def settings_dict(*instances):
    """One flat dict of every setting, for printing, config.json and checkpoints."""
    merged = {}
    for obj in instances:
        merged.update(dataclasses.asdict(obj))
    return merged
