"""config.py: settings from a config file and the command line, typed and checked."""

from dataclasses import dataclass

import pytest

from gptkit.config import parse_settings, read_config_file, setting, settings_dict
from gptkit.ops.errors import UserError


@dataclass
class TrainSettings:
    """Training"""

    n_layer: int = setting(12, "number of blocks")
    learning_rate: float = setting(6e-4, "peak learning rate")
    compile: bool = setting(True, "use torch.compile")
    out_dir: str = setting("out", "where checkpoints go")
    max_iters: int = setting(5000, "how many steps")

    def __post_init__(self):
        if self.n_layer < 1:
            raise ValueError(f"n_layer must be at least 1, got {self.n_layer}")


@dataclass
class SampleSettings:
    """Sampling"""

    top_k: int | None = setting(None, "keep the k likeliest tokens; none = all")
    temperature: float = setting(1.0, "softmax temperature")


CLASSES = [TrainSettings, SampleSettings]


def parse(argv):
    return parse_settings(argv, CLASSES, prog="t.py")


def write(tmp_path, text, name="cfg.py"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_defaults_and_both_spellings_of_a_flag():
    train, sample = parse([])
    assert train == TrainSettings() and sample == SampleSettings()
    train, sample = parse(["--n_layer=4", "--learning_rate", "1e-3", "--top-k", "50"])
    assert (train.n_layer, train.learning_rate, sample.top_k) == (4, 1e-3, 50)


@pytest.mark.parametrize(
    "text, expected",
    [("true", True), ("True", True), ("1", True), ("false", False), ("0", False), ("FALSE", False)],
)
def test_bool_values(text, expected):
    assert parse([f"--compile={text}"])[0].compile is expected


def test_int_float_str_and_none():
    train, sample = parse(["--max_iters", "5e3", "--learning_rate=3", "--out_dir", "runs/a",
                           "--top_k", "none", "--temperature", "0.8"])
    assert train.max_iters == 5000 and isinstance(train.max_iters, int)
    assert train.learning_rate == 3.0 and isinstance(train.learning_rate, float)
    assert train.out_dir == "runs/a"
    assert sample.top_k is None and sample.temperature == 0.8


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--compile", "maybe"], "bad value for --compile: 'maybe' (expected true/false/1/0)"),
        (["--n_layer", "2.5"], "bad value for --n_layer: '2.5' (expected an integer)"),
        (["--max_iters=abc"], "bad value for --max_iters: 'abc' (expected an integer)"),  # not "convert ... to float"
        (["--learning_rate", "fast"], "bad value for --learning_rate: 'fast' (expected a number)"),
        (["--max_iters", "none"], "bad value for --max_iters: 'none'"),  # not optional
    ],
)
def test_bad_values_are_named(argv, fragment):
    with pytest.raises(UserError) as e:
        parse(argv)
    assert fragment in str(e.value)


def test_integers_are_parsed_exactly_at_any_size():
    # Integers went through float(): --seed=9007199254740993 and ...992 were the same seed,
    # and sample.py's documented largest seed, 2**63 - 1, was refused as 2**63.
    from sample import SampleConfig

    for text, value in [("9007199254740993", 2**53 + 1), ("9007199254740992", 2**53), ("5e3", 5000), ("1e17", 10**17),
                        ("-4", -4), ("1_000", 1000)]:
        (train, _) = parse(["--max_iters", text])
        assert train.max_iters == value and isinstance(train.max_iters, int), text
    (cfg,) = parse_settings([f"--seed={2**63 - 1}"], [SampleConfig], prog="sample.py")
    assert cfg.seed == 2**63 - 1
    with pytest.raises(UserError, match="must be between 0 and 2\\*\\*63 - 1"):
        parse_settings([f"--seed={2**63}"], [SampleConfig], prog="sample.py")
    for text in ("2.5", "1e-3", "1e99999", "nan", "0x10"):
        with pytest.raises(UserError, match="expected an integer"):
            parse(["--max_iters", text])


def test_infinite_int_is_a_bad_value_not_a_crash():
    with pytest.raises(UserError, match="bad value for --max_iters"):
        parse(["--max_iters", "inf"])


def test_unknown_key_on_the_command_line_suggests_the_name():
    with pytest.raises(UserError) as e:
        parse(["--n_layers=4"])
    assert str(e.value) == "unknown setting '--n_layers' (did you mean 'n_layer'?)"
    with pytest.raises(UserError, match=r"unknown setting '--zzz'$"):
        parse(["--zzz", "1"])


def test_other_trainers_names_point_to_ours():
    # --lr is too short for difflib to find learning_rate; known aliases are named.
    with pytest.raises(UserError, match=r"unknown setting '--lr' \(did you mean 'learning_rate'\?\)"):
        parse(["--lr=1e-3"])
    with pytest.raises(UserError, match="did you mean 'max_iters'"):
        parse(["--max_steps", "10"])


def test_unknown_key_in_a_file_names_the_file_and_suggests(tmp_path):
    path = write(tmp_path, "n_layer = 4\nlearning_rat = 1e-3\n")
    with pytest.raises(UserError) as e:
        parse([path])
    assert str(e.value) == f"unknown setting 'learning_rat' in {path} (did you mean 'learning_rate'?)"


def test_file_values_are_type_checked(tmp_path):
    path = write(tmp_path, "n_layer = '4'\n")
    with pytest.raises(UserError, match=r"n_layer = '4' in .*cfg.py: expected int"):
        parse([path])
    path = write(tmp_path, "compile = 1\n")  # a bool field wants True/False, not 1
    with pytest.raises(UserError, match="expected bool"):
        parse([path])
    path = write(tmp_path, "learning_rate = 1\ntop_k = None\n")  # int is fine for a float
    train, sample = parse([path])
    assert train.learning_rate == 1 and sample.top_k is None


def test_command_line_overrides_the_file(tmp_path):
    path = write(tmp_path, "n_layer = 6\nmax_iters = 100\n")
    train, _ = parse([path, "--n_layer=2"])
    assert (train.n_layer, train.max_iters) == (2, 100)
    train, _ = parse(["--n_layer=2", path])  # the order does not matter
    assert train.n_layer == 2


def test_file_runs_in_its_own_namespace_with_imports_and_helpers(tmp_path):
    path = write(
        tmp_path,
        "import math\n"
        "def width(layers):\n"
        "    return 64 * layers\n"
        "class Unused:\n"
        "    pass\n"
        "_scratch = 3\n"
        "n_layer = 2 + _scratch\n"
        "learning_rate = 1e-3 * math.sqrt(width(4) / 256)\n",
    )
    train, _ = parse([path])
    assert train.n_layer == 5 and train.learning_rate == pytest.approx(1e-3)
    assert "math" not in globals() and "width" not in globals()
    assert read_config_file(path) == {"n_layer": 5, "learning_rate": pytest.approx(1e-3)}


def test_from_import_of_a_builtin_function_is_fine(tmp_path):
    path = write(tmp_path, "from math import sqrt\nlearning_rate = 1e-3 * sqrt(4)\n")
    assert parse([path])[0].learning_rate == pytest.approx(2e-3)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("n_layer = (\n", "line"),
        ("n_layer = 1 / 0\n", "failed to run: ZeroDivisionError"),
        ("import not_a_module_xyz\n", "failed to run: ModuleNotFoundError"),
    ],
)
def test_broken_config_file_is_a_user_error(tmp_path, text, fragment):
    path = write(tmp_path, text)
    with pytest.raises(UserError) as e:
        parse([path])
    assert path in str(e.value) and fragment in str(e.value)


def test_missing_config_file(tmp_path):
    with pytest.raises(UserError, match="config file .*nope.py does not exist"):
        parse([str(tmp_path / "nope.py")])


def test_post_init_value_error_becomes_a_user_error(tmp_path):
    with pytest.raises(UserError, match="n_layer must be at least 1, got 0"):
        parse(["--n_layer=0"])
    with pytest.raises(UserError, match="n_layer must be at least 1, got -1"):
        parse([write(tmp_path, "n_layer = -1\n")])


def test_malformed_arguments():
    with pytest.raises(UserError, match="--n_layer needs a value"):
        parse(["--n_layer"])
    with pytest.raises(UserError, match="--compile needs a value"):
        parse(["--compile", "--n_layer=2"])
    with pytest.raises(UserError, match="unexpected argument 'extra'"):
        parse(["extra"])
    with pytest.raises(UserError, match="unexpected argument 'b.py'"):
        parse(["a.py", "b.py"])


def test_help_lists_every_field_with_default_and_help(capsys):
    with pytest.raises(SystemExit) as e:
        parse(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python t.py [CONFIG.py]")
    for cls in CLASSES:
        for name, field in cls.__dataclass_fields__.items():
            assert f"--{name} (" in out, name
            assert field.metadata["help"] in out, name
    assert "--n_layer (int, default 12)" in out
    assert "--top_k (int or none, default None)" in out
    assert "--out_dir (str, default 'out')" in out
    assert "Training:" in out and "Sampling:" in out


def test_settings_dict_merges_instances():
    train, sample = parse(["--n_layer=3"])
    merged = settings_dict(train, sample)
    assert merged["n_layer"] == 3 and merged["top_k"] is None and len(merged) == 7


def test_a_setting_declared_twice_is_a_programming_error():
    @dataclass
    class Clash:
        n_layer: int = setting(1, "again")

    with pytest.raises(AssertionError, match="n_layer is declared twice"):
        parse_settings([], [TrainSettings, Clash])
