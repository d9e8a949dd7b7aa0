"""gptkit/models/loading.py: finding a checkpoint, and what to do when there is none."""

import pytest

from gptkit.ops.errors import UserError
from gptkit.models.loading import find_checkpoint


@pytest.mark.parametrize("out_dir, command", [
    ("out-shakespeare-char", "python train.py configs/shakespeare_char.py,"),  # not the quick start's config
    ("out-shakespeare-gpt2/", "python train.py configs/finetune_shakespeare.py,"),
    ("out-shakespeare", "python train.py configs/shakespeare.py,"),
    ("runs/mine", "python train.py configs/shakespeare.py --out_dir=runs/mine,"),
])
def test_no_checkpoint_names_the_config_that_writes_the_folder(tmp_path, monkeypatch, out_dir, command):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as info:
        find_checkpoint(out_dir)
    assert f"train one first with {command}" in str(info.value)
    (tmp_path / out_dir).mkdir(parents=True)
    with pytest.raises(UserError, match="looked for best.pt and ckpt.pt"):
        find_checkpoint(out_dir)
