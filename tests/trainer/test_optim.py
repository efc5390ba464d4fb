"""Learning-rate schedule: hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from lmpo.trainer.config import OptimConfig
from lmpo.trainer.run.optim import Schedule, build_optimizer, lr_at


def test_warmup_then_constant():
    cfg = OptimConfig(lr=1.0, warmup_steps=4)
    # warm-up lr·(k+1)/W: 0.25, 0.5, 0.75, 1.0, then constant 1.0
    assert [lr_at(k, cfg, 10) for k in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_linear_and_cosine_decay():
    lin = OptimConfig(lr=2.0, warmup_steps=0, schedule="linear", min_lr_ratio=0.5)
    # p = k/10; lr = 2·(0.5 + 0.5·(1−p)): k=0 → 2.0, k=5 → 1.5, k=10 → 1.0
    assert [lr_at(k, lin, 10) for k in (0, 5, 10)] == pytest.approx([2.0, 1.5, 1.0])
    cos = OptimConfig(lr=1.0, warmup_steps=2, schedule="cosine", min_lr_ratio=0.0)
    # after 2 warm-up steps, p = (k−2)/8: k=6 → p=0.5 → ½(1+cos(π/2)) = 0.5; k=10 → 0
    assert lr_at(6, cos, 10) == pytest.approx(0.5)
    assert lr_at(10, cos, 10) == pytest.approx(0.0, abs=1e-12)
    assert lr_at(4, cos, 10) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.25)))


def test_schedule_state_roundtrip_sets_optimizer_lr():
    p = torch.nn.Parameter(torch.zeros(2))
    cfg = OptimConfig(lr=1.0, warmup_steps=4)
    opt = build_optimizer([p], cfg)
    sched = Schedule(opt, cfg, total_steps=8)
    sched.advance()
    assert sched.apply() == 0.5 and opt.param_groups[0]["lr"] == 0.5
    other = Schedule(opt, cfg, total_steps=8)
    other.load_state_dict(sched.state_dict())
    assert other.current_lr() == 0.5


def test_cpu_adamw_is_multi_tensor_and_equals_the_per_parameter_loop_bit_for_bit():
    """build_optimizer takes torch's multi-tensor AdamW on CPU (torch's own default there is the per-parameter
    loop): the same weights bit for bit after a few steps with decay, on tensors of several shapes."""
    cfg = OptimConfig(lr=1e-2, weight_decay=0.1)
    gen = torch.Generator().manual_seed(0)
    shapes = [(7, 5), (5,), (3, 4, 2)]
    start = [torch.randn(s, generator=gen) for s in shapes]
    grads = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(3)]
    runs = []
    for make in (lambda ps: build_optimizer(ps, cfg), lambda ps: torch.optim.AdamW(
            ps, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay, foreach=False)):
        params = [torch.nn.Parameter(t.clone()) for t in start]
        opt = make(params)
        for step_grads in grads:
            for p, g in zip(params, step_grads):
                p.grad = g.clone()
            opt.step()
        runs.append((opt.defaults["foreach"], params))
    assert runs[0][0] is True
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))
