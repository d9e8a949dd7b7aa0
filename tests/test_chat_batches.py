"""Packing keeps conversations whole; the target-only loss over micro-batches of different
target counts is the global mean, computed here by hand."""

import math

import torch

from gptkit.chat_batches import global_target_count, pack_best_fit, target_loss_sum


def test_packing_keeps_conversations_whole_and_every_window_has_targets():
    convs = [([7] * n, [0] * (n // 2) + [1] * (n - n // 2)) for n in (9, 3, 5, 2, 6, 1 + 1)]
    ids, mask = pack_best_fit(convs, 10, pad_id=0)
    assert len(ids) % 10 == 0 and len(ids) == len(mask)
    assert sum(mask) == sum(sum(m) for _, m in convs)  # no target lost or added
    for w in range(0, len(ids), 10):
        assert sum(mask[w:w + 10]) > 0
    assert len(ids) // 10 == math.ceil(sum(len(c[0]) for c in convs) / 10)  # best fit: no window wasted here


def test_two_micro_batches_with_different_target_counts_give_the_exact_global_mean():
    torch.manual_seed(0)
    V = 11
    micro = []
    for frac in (0.1, 0.8):  # few targets, then many
        logits = torch.randn(2, 8, V)
        targets = torch.randint(V, (2, 8))
        mask = torch.rand(2, 8) < frac
        mask[0, 0] = True
        micro.append((logits, targets, mask))
    count = global_target_count([m for _, _, m in micro])
    loss = sum(target_loss_sum(l, t, m)[0] for l, t, m in micro) / count
    by_hand = []
    for l, t, m in micro:
        for b in range(2):
            for i in range(8):
                if m[b, i]:
                    by_hand.append(-torch.log_softmax(l[b, i], -1)[t[b, i]].item())
    assert abs(loss.item() - sum(by_hand) / len(by_hand)) < 1e-6
    mean_of_means = sum(target_loss_sum(l, t, m)[0] / m.sum() for l, t, m in micro) / 2
    assert abs(mean_of_means.item() - loss.item()) > 1e-3  # the shortcut would be wrong here
