"""gptkit/fused.py: the hand-written backward passes agree with autograd's."""

import torch
import torch.nn.functional as F

from gptkit import fused


def test_relu2_gradient_is_autograd_s_bitwise():
    h = torch.randn(4, 8, 32)
    a, b = h.clone().requires_grad_(), h.clone().requires_grad_()
    g = torch.randn_like(h)
    F.relu(a).square().backward(g)
    fused.relu2(b).backward(g)
    assert torch.equal(fused.relu2(h), F.relu(h).square())
    assert torch.equal(a.grad, b.grad)


def test_rms_norm_matches_the_library_and_passes_gradcheck():
    x = torch.randn(3, 5, 16) * 3
    w = torch.rand(16) + 0.5
    torch.testing.assert_close(fused.rms_norm(x, w, 1e-5), F.rms_norm(x, (16,), w, 1e-5))
    x64 = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    w64 = (torch.rand(8, dtype=torch.float64) + 0.5).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: fused.rms_norm(a, b, 1e-5), (x64, w64))


def test_model_uses_them_only_for_float32_on_cpu():
    assert fused.use_fused(torch.zeros(2))
    assert not fused.use_fused(torch.zeros(2, dtype=torch.bfloat16))
