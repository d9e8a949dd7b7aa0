"""Where a GPT's parameters are: an exact count per component beside the 12·L·d² estimate.

Each block holds about 12·d² weights: 4·d² in attention (q, k, v and the output
projection) and 8·d² in the MLP (d -> 4d -> d); Kaplan et al. 2020 (section 2.1) count
a model's size as these non-embedding parameters. The model is built on PyTorch's meta
device, so shapes exist but no memory is allocated: a 7B-shaped config counts in a second.

    python lab.py params configs/gpt2.py          # 124,439,808
    python lab.py params configs/llama2_7b.py     # 6,738,415,616
    python lab.py params configs/shakespeare.py   # 804,480 once data/shakespeare_char is prepared
    python lab.py params --n_layer=6 --n_head=6 --n_embd=384 --vocab_size=65 --block_size=256

A config file may hold training settings too; only the GPTConfig fields are used, and
`dataset` / `data_dir` (as train.py reads them) to find the vocabulary size: train.py
takes it from the prepared dataset's meta.json, so we do too. When the dataset is not
prepared, the report says which vocabulary size it assumed and how to pass another.
"""

import dataclasses
import difflib
import typing

from gptkit.config import check_value, parse_value, read_config_file, split_argv
from gptkit.data.dataset import dataset_dir, load_meta, prepare_command
from gptkit.models.shapes import meta_model
from gptkit.ops.errors import UserError
from model import GPTConfig

COMPONENTS = (
    ("token embedding (wte)", "transformer.wte."),
    ("position embedding (wpe)", "transformer.wpe."),
    ("attention (c_attn, c_proj, q/k norms)", ".attn."),
    ("MLP (c_fc, c_proj)", ".mlp."),
    ("block norms (ln_1, ln_2)", (".ln_1.", ".ln_2.")),
    ("final norm (ln_f)", "transformer.ln_f."),
    ("output layer (lm_head)", "lm_head."),
    ("other (names model.py's edits added)", ""),  # "" is in every name: what matched none above
)
EMBEDDING_COMPONENTS = ("token embedding (wte)", "position embedding (wpe)", "output layer (lm_head)")


def _matches(param_name, marker):
    markers = marker if isinstance(marker, tuple) else (marker,)
    return any(m in param_name for m in markers)


def parameter_table(config):
    """[(component, count), ...] in COMPONENTS order, every parameter counted once (a
    tied lm_head shares wte's matrix and counts 0)."""
    counts = {name: 0 for name, _ in COMPONENTS}
    for param_name, p in meta_model(config).named_parameters():  # tied weights appear once
        component = next(name for name, marker in COMPONENTS if _matches(param_name, marker))
        counts[component] += p.numel()
    return list(counts.items())


def padding_rows(config):
    """Parameters in embedding rows added by pad_vocab_multiple: never used, not counted."""
    tables = 1 if config.tie_embeddings else 2
    return (config.padded_vocab_size - config.vocab_size) * config.n_embd * tables


def format_parameter_report(config):
    rows = parameter_table(config)
    padding = padding_rows(config)
    if padding:  # report the model as defined; the padding rows get a line of their own
        per_table = (config.padded_vocab_size - config.vocab_size) * config.n_embd
        rows = [(name, count - per_table if name in ("token embedding (wte)", "output layer (lm_head)") and count else count)
                for name, count in rows]
    counts = dict(rows)
    total = sum(counts.values())
    non_embedding = total - sum(counts[name] for name in EMBEDDING_COMPONENTS)
    L, d = config.n_layer, config.n_embd
    estimate = 12 * L * d * d
    embedding_estimate = config.vocab_size * d * (1 if config.tie_embeddings else 2)
    if config.pos_encoding == "learned":
        embedding_estimate += config.block_size * d

    lines = [
        f"{L} layers, {config.n_head} heads, width {d}, vocabulary {config.vocab_size}, "
        f"context {config.block_size}, {config.mlp} MLP (hidden {config.hidden_size}), "
        f"{config.norm}, {config.pos_encoding} positions, "
        f"{'tied' if config.tie_embeddings else 'untied'} embeddings, biases {'on' if config.bias else 'off'}",
        "",
        f"{'component':<40}{'parameters':>16}{'share':>8}",
    ]
    for name, count in rows:
        if count or name == "output layer (lm_head)":
            note = "  (tied to wte)" if name == "output layer (lm_head)" and config.tie_embeddings else ""
            lines.append(f"{name:<40}{count:>16,}{count / total:>8.1%}{note}")
    lines.append(f"{'total':<40}{total:>16,}")
    if padding:
        lines.append(
            f"{'+ vocabulary padding (never predicted)':<40}{padding:>16,}"
            f"  (pad_vocab_multiple={config.pad_vocab_multiple}: {total + padding:,} in memory)"
        )
    lines += [
        "",
        f"{'':<40}{'exact':>16}{'estimate':>16}{'exact/est.':>12}",
        f"{'without embeddings (12·L·d²)':<40}{non_embedding:>16,}{estimate:>16,}{non_embedding / estimate:>12.4f}",
        f"{'with embeddings (+ V·d per table, T·d)':<40}{total:>16,}{estimate + embedding_estimate:>16,}"
        f"{total / (estimate + embedding_estimate):>12.4f}",
    ]
    return "\n".join(lines)


DATA_SETTINGS = {"dataset": str, "data_dir": str}  # train.py's, read to find the vocabulary


def config_from_argv(argv):
    """(GPTConfig, note or None) from [CONFIG.py] [--key=value ...]. Keys a config file sets
    for other scripts (learning_rate, ...) are ignored, unknown --keys are an error. Unless
    vocab_size is set, it is the dataset's (as in train.py); the note says where it came from."""
    types = {**typing.get_type_hints(GPTConfig), **DATA_SETTINGS}  # field name -> type
    path, pairs = split_argv(argv)
    values = {}
    if path is not None:
        for name, value in read_config_file(path).items():
            if name not in types:
                continue  # a training or sampling setting: not ours to judge
            if not check_value(value, types[name]):
                raise UserError(f"{name} = {value!r} in {path}: does not fit the setting's type")
            values[name] = value
    for name, text, where in pairs:
        if name not in types:
            close = difflib.get_close_matches(name, list(types), n=1)
            hint = f" (did you mean '--{close[0]}'?)" if close else ""
            raise UserError(f"unknown model setting '{where}'{hint}")
        try:
            values[name] = parse_value(text, types[name])
        except ValueError as e:
            raise UserError(f"bad value for {where}: {text!r} ({e})")
    name, data_dir = values.pop("dataset", None), values.pop("data_dir", "data")
    note = None
    if not any(key == "vocab_size" for key, _, _ in pairs):  # --vocab_size wins; else as train.py
        values["vocab_size"], note = dataset_vocab_size(name, data_dir, values.get("vocab_size"))
    try:
        return GPTConfig(**values), note
    except ValueError as e:
        raise UserError(str(e))


def dataset_vocab_size(name, data_dir, configured=None):
    """(vocab_size, note): the prepared dataset's, as train.py uses it from scratch; else
    the config file's, else GPT-2's with a note saying so."""
    how = "pass --vocab_size=N to count another"
    if name is None or not (dataset_dir(data_dir, name) / "meta.json").is_file():
        if configured is not None:
            return configured, None
        default = GPTConfig.vocab_size  # GPT-2 BPE's 50257
        if name is None:
            return default, f"note: vocabulary {default:,} assumed (GPT-2 BPE; the config names no dataset); {how}"
        return default, (
            f"note: vocabulary {default:,} assumed (GPT-2 BPE): dataset {name} is not prepared in {data_dir}/; "
            f"run {prepare_command(name)} to count with its vocabulary, or {how}"
        )
    meta = load_meta(data_dir, name)
    return meta["vocab_size"], (
        f"vocabulary {meta['vocab_size']:,} from {dataset_dir(data_dir, name) / 'meta.json'} "
        f"({meta['tokenizer'].get('type')} tokenizer)"
    )


def report_from_argv(argv):
    """The report for `python lab.py params [CONFIG.py] [--key=value ...]`."""
    config, note = config_from_argv(argv)
    report = format_parameter_report(config)
    return report if note is None else f"{note}\n\n{report}"


def usage():
    fields = ", ".join(f.name for f in dataclasses.fields(GPTConfig))
    return __doc__.strip() + f"\n\nmodel settings: {fields}, and dataset, data_dir"
