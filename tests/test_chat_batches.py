"""Packing keeps conversations whole and fits them best (the exact target-only loss is
tested with training, tests/train/test_chat_train.py)."""

import math

import numpy as np

from gptkit.data.chat_batches import conversations_of, pack_best_fit


def test_packing_keeps_conversations_whole_and_every_window_has_targets():
    convs = [([7] * n, [0] * (n // 2) + [1] * (n - n // 2)) for n in (9, 3, 5, 2, 6, 1 + 1)]
    ids, mask = pack_best_fit(convs, 10, pad_id=0)
    assert len(ids) % 10 == 0 and len(ids) == len(mask)
    assert sum(mask) == sum(sum(m) for _, m in convs)  # no target lost or added
    for w in range(0, len(ids), 10):
        assert sum(mask[w:w + 10]) > 0
    assert len(ids) // 10 == math.ceil(sum(len(c[0]) for c in convs) / 10)  # best fit: no window wasted here


def test_best_fit_takes_the_window_with_least_room_that_holds_it():
    convs = [([n] * n, [1] * n) for n in (6, 5, 4, 3)]  # windows of 8: 6 | 5 then 3 fits the 5's (room 3) | 4
    ids, mask = pack_best_fit(convs, 8, pad_id=0)
    assert ids == [6] * 6 + [0, 0] + [5] * 5 + [3] * 3 + [4] * 4 + [0] * 4
    assert mask == [1] * 6 + [0, 0] + [1] * 8 + [1] * 4 + [0] * 4


def test_a_bin_is_cut_back_into_its_conversations_at_the_start_marks():
    ids = np.array([9, 1, 2, 9, 3, 4, 5])
    mask = np.array([2, 0, 1, 2, 0, 1, 1], dtype=np.uint8)
    assert conversations_of(ids, mask) == [([9, 1, 2], [0, 0, 1]), ([9, 3, 4, 5], [0, 0, 1, 1])]
