"""The one inference-mode context: eval mode and no grad inside, exact per-submodule flags after."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from raysim.rollout.inference import inference


def make_net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(6, 16),
        nn.BatchNorm1d(16),
        nn.Tanh(),
        nn.Dropout(0.5),
        nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.5)),
        nn.Linear(16, 3),
    )


def flags(module: nn.Module) -> dict[str, bool]:
    return {name: m.training for name, m in module.named_modules()}


def mixed_train_root() -> nn.Sequential:
    """A root in train mode holding one child deliberately in eval mode."""
    net = make_net().train()
    net[4].eval()
    return net


def mixed_eval_root() -> nn.Sequential:
    """The reverse: a root in eval mode holding children in train mode."""
    net = make_net().eval()
    net[1].train()
    net[4][1].train()
    return net


@pytest.mark.parametrize("build", [mixed_train_root, mixed_eval_root], ids=["train-root", "eval-root"])
def test_mixed_training_flags_are_restored_exactly_after_the_block(build):
    net = build()
    before = flags(net)
    assert len(set(before.values())) == 2  # genuinely mixed
    with inference(net):
        assert not any(flags(net).values())
    assert flags(net) == before


@pytest.mark.parametrize("build", [mixed_train_root, mixed_eval_root], ids=["train-root", "eval-root"])
def test_mixed_training_flags_are_restored_exactly_when_the_block_raises(build):
    net = build()
    before = flags(net)
    with pytest.raises(KeyError, match="boom"):
        with inference(net):
            assert not any(flags(net).values())
            raise KeyError("boom")
    assert flags(net) == before
    assert torch.is_grad_enabled()


def test_dropout_is_off_inside_and_outputs_equal_eval_mode_output():
    net = make_net().train()
    x = torch.randn(32, 6)
    with torch.no_grad():
        net(x)  # one train-mode pass so the running statistics are not the initial ones
    reference = make_net()
    reference.load_state_dict(net.state_dict())
    reference.eval()
    with torch.no_grad():
        expected = reference(x)
    with inference(net):
        first = net(x)
        second = net(x)
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    torch.testing.assert_close(first, expected, rtol=0, atol=0)
    # outside, in train mode, dropout is active again: two passes differ
    with torch.no_grad():
        assert not torch.equal(net(x), net(x))


def test_batchnorm_uses_running_statistics_inside_and_does_not_update_them():
    net = make_net().train()
    bn = net[1]
    x = torch.randn(1, 6)  # one row: train-mode BatchNorm refuses it
    with pytest.raises(ValueError):
        net(x)
    with torch.no_grad():
        net(torch.randn(64, 6) * 3 + 1)
    running = (bn.running_mean.clone(), bn.running_var.clone(), bn.num_batches_tracked.clone())
    reference = make_net()
    reference.load_state_dict(net.state_dict())
    reference.eval()
    with inference(net):
        out = net(x)
    with torch.no_grad():
        expected = reference(x)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert torch.equal(bn.running_mean, running[0])
    assert torch.equal(bn.running_var, running[1])
    assert torch.equal(bn.num_batches_tracked, running[2])
    assert net.training and bn.training


def test_gradients_are_off_inside_and_back_on_after():
    net = make_net()
    x = torch.randn(4, 6, requires_grad=True)
    with inference(net) as inside:
        assert inside is net
        assert not torch.is_grad_enabled()
        out = net(x)
        assert not out.requires_grad
        assert out.grad_fn is None
    assert torch.is_grad_enabled()
    assert net(x).requires_grad
