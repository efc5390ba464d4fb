"""End-to-end agent tests on the tiny masked echo environment: learning, determinism, resume."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from sac_echo_env import EchoEnv

from lmpo.textagent.sac.config import TrainConfig, apply_overrides
from lmpo.textagent.sac.train import EnvBundle, Trainer, train

A = 10


def _bundle(num_envs: int = 4) -> EnvBundle:
    return EnvBundle(envs=[EchoEnv(A) for _ in range(num_envs)], num_actions=A, pad_id=0, eos_id=1, window=3,
                     decode=lambda ids: "".join(chr(0x4e00 + i) for i in ids),
                     code_points=np.array([-1, -1, -1] + [0x4e00 + i for i in range(3, A)]))


def _cfg(**over) -> TrainConfig:
    base = {
        "num_envs": 4, "total_env_steps": 100_000, "learning_starts": 64, "log_every_updates": 25,
        "checkpoint_every_updates": 0, "threads": 1,
        "net": {"embed_dim": 16, "gru_hidden": 32, "policy_hidden": 32, "q_hidden": 32, "action_embed_dim": 16},
        "sac": {"gamma": 0.5, "lr_policy": 1e-3, "lr_q": 1e-3, "alpha_init": 0.3, "autotune_alpha": False,
                "bc_weight": 0.0, "top_p_k_max": 4, "cql_weight": 0.1},
        "replay": {"transitions_per_batch": 64, "agent_capacity": 5000, "demo_capacity": 5000,
                   "teacher_ratio_start": 0.0, "teacher_ratio_end": 0.0},
    }
    cfg = apply_overrides(TrainConfig(), base)
    return apply_overrides(cfg, over)


def _greedy_reward(agent, episodes: int = 20) -> float:
    env = EchoEnv(A)
    total, steps = 0.0, 0
    for ep in range(episodes):
        obs, _ = env.reset(seed=10_000 + ep)
        done = False
        while not done:
            a, _ = agent.act(obs["window"][None], obs["legal_mask"][None].astype(bool), greedy=True)
            obs, r, term, trunc, _ = env.step(int(a[0]))
            total, steps, done = total + r, steps + 1, term or trunc
    return total / steps


def test_pure_sac_solves_masked_echo(tmp_path):
    # no teacher, no BC: only the soft Q backup and the expected policy loss can teach the echo
    trainer = Trainer(_cfg(), tmp_path, bundle=_bundle(), progress=False)
    before = _greedy_reward(trainer.agent)
    trainer.run(max_updates=300)
    after = _greedy_reward(trainer.agent)
    assert before < 0.4  # chance is 1/7 over the legal characters
    assert after >= 0.9, f"greedy echo reward {after:.3f} after 300 updates"
    assert trainer.counters["illegal"] == 0  # the hard mask never lets an illegal action through


def _params(agent) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in agent.policy.parameters()]
                     + [p.detach().flatten() for p in agent.critic.parameters()])


def test_same_seed_same_result_and_resume_is_bit_exact(tmp_path):
    cfg = _cfg(**{"replay.teacher_ratio_start": 1.0, "replay.teacher_anneal_env_steps": 400,
                  "replay.teacher_ratio_end": 0.1, "sac.bc_weight": 0.1, "sac.autotune_alpha": True})
    a = Trainer(cfg, tmp_path / "a", bundle=_bundle(), progress=False)
    a.run(max_updates=60)
    b = Trainer(cfg, tmp_path / "b", bundle=_bundle(), progress=False)
    b.run(max_updates=60)
    assert torch.equal(_params(a.agent), _params(b.agent))
    # resume: 30 updates, save (run() saves at exit), fresh process state, 30 more
    c = Trainer(cfg, tmp_path / "c", bundle=_bundle(), progress=False)
    c.run(max_updates=30)
    torch.manual_seed(12345)  # disturb global RNG: resume must restore it
    d = Trainer(cfg, tmp_path / "c", bundle=_bundle(), progress=False)
    d.load()
    d.run(max_updates=60)
    assert d.agent.updates == 60 and d.env_steps == a.env_steps
    assert torch.equal(_params(a.agent), _params(d.agent))
    assert float(a.agent.log_alpha) == float(d.agent.log_alpha)
    different = Trainer(apply_overrides(cfg, {"seed": 1}), tmp_path / "e", bundle=_bundle(), progress=False)
    different.run(max_updates=60)
    assert not torch.equal(_params(a.agent), _params(different.agent))


def test_train_writes_metrics_and_summary(tmp_path):
    cfg = _cfg(**{"replay.teacher_ratio_start": 0.5, "replay.teacher_ratio_end": 0.5})
    summary = train(cfg, tmp_path, bundle=_bundle(), progress=False, max_updates=50, trace_steps=3)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and rows[-1]["step/updates"] == 50
    for key in ("policy/entropy", "policy/alpha", "policy/top_p_coverage", "value/td_error_abs_p90",
                "losses/cql", "data/demo_share", "data/kl_teacher_pi", "data/teacher_ratio"):
        assert key in rows[-1] and np.isfinite(rows[-1][key]), key
    assert 0.3 < rows[-1]["data/teacher_ratio"] < 0.7 or rows[-1]["data/teacher_ratio"] == 0.5
    assert summary["updates"] == 50 and summary["nonfinite_skips"] == 0
    trace = (tmp_path / "trace.log").read_text().splitlines()
    assert len(trace) == 3 and trace[0].startswith("Step 01 | prev=")


def _bc_batch() -> tuple[object, torch.Tensor]:
    from lmpo.textagent.sac.replay import ReplaySample

    g = torch.Generator().manual_seed(3)
    B = 4
    legal = torch.ones(B, A, dtype=torch.bool)
    legal[:, 0] = False
    legal[3, 7] = False  # row 3: its reference character 7 is forbidden (agent row: no label)
    batch = ReplaySample(
        obs=torch.randint(3, A, (B, 3), generator=g), legal=legal, action=torch.tensor([4, 5, 6, 8]),
        reward=torch.zeros(B), next_obs=torch.randint(3, A, (B, 3), generator=g), next_legal=legal.clone(),
        terminated=torch.zeros(B), truncated=torch.zeros(B),
        is_demo=torch.tensor([True, True, False, False]), teacher_action=torch.tensor([4, 9, 3, 7]),
        is_relabeled=torch.tensor([False, True, False, False]),
    )
    return batch, legal


def test_bc_rows_demo_and_all_label_the_right_rows():
    # demo: rows 0 (label 4) and 1 (relabelled: clones the stepped action 5, not the forbidden 9);
    # all: rows 0, 1 and agent row 2 (label = its reference 3); row 3's reference is illegal → no label
    from lmpo.textagent.sac.agent import SACAgent

    batch, legal = _bc_batch()
    for rows, expect_rows, labels in (("demo", [0, 1], [4, 5]), ("all", [0, 1, 2], [4, 5, 3])):
        cfg = _cfg(sac={"bc_rows": rows, "bc_weight": 1.0})
        agent = SACAgent(A, 0, cfg.net, cfg.sac, seed=0)
        with torch.no_grad():
            agent.policy.eval()  # no dropout in this config, eval() only to be explicit
            _, logp = agent.policy(batch.obs, legal)
            agent.policy.train()
        expect = -logp[expect_rows, labels].mean()
        stats = agent.update(batch)
        assert float(stats["losses/bc"]) == pytest.approx(float(expect), rel=1e-5), rows
    with pytest.raises(ValueError, match="bc_rows"):
        _cfg(sac={"bc_rows": "agent"}).validate()


def test_bc_rows_none_is_the_text_windows_alone():
    # "none": no replay row is cloned, the BC term is the mean cross-entropy of the text windows passed in
    from lmpo.textagent.sac.agent import SACAgent

    batch, legal = _bc_batch()
    g = torch.Generator().manual_seed(5)
    text = (torch.randint(3, A, (6, 3), generator=g), torch.ones(6, A, dtype=torch.bool),
            torch.randint(3, A, (6,), generator=g))
    for rows, with_demo in (("none", False), ("demo", True)):
        cfg = _cfg(sac={"bc_rows": rows, "bc_weight": 1.0, "bc_text_batch": 6})
        agent = SACAgent(A, 0, cfg.net, cfg.sac, seed=0)
        with torch.no_grad():
            _, logp_text = agent.policy(text[0], text[1])
            _, logp = agent.policy(batch.obs, legal)
        expect = -logp_text[torch.arange(6), text[2]].mean()
        if with_demo:
            expect = expect - logp[[0, 1], [4, 5]].mean()
        stats = agent.update(batch, text_batch=text)
        assert float(stats["losses/bc"]) == pytest.approx(float(expect), rel=1e-5), rows
    with pytest.raises(ValueError, match="bc_text_batch"):
        _cfg(sac={"bc_rows": "none", "bc_weight": 1.0}).validate()
