"""Network identities: the split first layer of Q equals the MLP on [c; Emb_act(a)]; masking invariances."""

from __future__ import annotations

import numpy as np
import torch
from sac_echo_env import EchoEnv

from lmpo.textagent.sac.config import NetworkConfig, TrainConfig, apply_overrides
from lmpo.textagent.sac.networks import PolicyNetwork, QHead, TwinQNetwork
from lmpo.textagent.sac.train import EnvBundle, Trainer

CFG = NetworkConfig(embed_dim=8, gru_hidden=12, policy_hidden=16, q_hidden=10, action_embed_dim=6)


def test_q_head_split_equals_concatenated_mlp():
    torch.manual_seed(0)
    head = QHead(20, CFG)
    c = torch.randn(4, 12)
    actions = torch.randint(0, 20, (4, 5))
    # naive: Linear on the concatenation [c; e_a] with W = [W_c | W_a], then ReLU and the output layer
    W = torch.cat([head.ctx_proj.weight, head.act_proj.weight], dim=1)  # (Hq, H + E_a)
    x = torch.cat([c.unsqueeze(1).expand(4, 5, 12), head.action_embed(actions)], dim=-1)  # (B, K, H + E_a)
    naive = head.out(torch.relu(x @ W.T + head.ctx_proj.bias)).squeeze(-1)
    torch.testing.assert_close(head(c, actions), naive)
    all_q = head.all_actions(c)  # (B, A)
    torch.testing.assert_close(all_q.gather(-1, actions), naive)


def test_twin_heads_are_independent_and_policy_masks():
    torch.manual_seed(1)
    twin = TwinQNetwork(20, 0, CFG)
    ctx = twin.context(torch.randint(0, 20, (3, 7)))
    q1, q2 = twin(ctx, torch.arange(20).expand(3, 20))
    assert not torch.allclose(q1, q2)
    pol = PolicyNetwork(20, 0, CFG)
    win = torch.randint(1, 20, (3, 7))
    legal = torch.rand(3, 20) > 0.5
    legal[:, 1] = True
    probs, logp = pol(win, legal)
    assert torch.all(probs[~legal] == 0)
    torch.testing.assert_close(probs.sum(-1), torch.ones(3))
    # the pad id embeds to zeros (padding_idx), so left padding carries no learned content
    assert torch.all(pol.encoder.embed.weight[0] == 0)


class ForbiddenTeacherEcho(EchoEnv):
    """Echo env whose mask forbids the target on even steps (a teacher/mask conflict)."""

    def _draw(self) -> None:
        super()._draw()
        if getattr(self, "t", 0) % 2 == 0:
            self.legal[self.target] = 0


def _bundle(env_cls) -> EnvBundle:
    A = 10
    return EnvBundle(envs=[env_cls(A) for _ in range(2)], num_actions=A, pad_id=0, eos_id=1, window=3,
                     decode=lambda ids: "".join(chr(0x4e00 + i) for i in ids),
                     code_points=np.array([-1, -1, -1] + [0x4e00 + i for i in range(3, A)]))


def test_mask_conflict_relabel_and_reject(tmp_path):
    base = apply_overrides(TrainConfig(), {
        "num_envs": 2, "total_env_steps": 40, "learning_starts": 10_000, "checkpoint_every_updates": 0,
        "net": {"embed_dim": 8, "gru_hidden": 12, "policy_hidden": 16, "q_hidden": 10, "action_embed_dim": 6},
        "replay": {"teacher_ratio_start": 1.0, "teacher_ratio_end": 1.0, "agent_capacity": 100,
                   "demo_capacity": 100},
    })
    t = Trainer(base, tmp_path / "relabel", bundle=_bundle(ForbiddenTeacherEcho), progress=False)
    t.run()
    n = t.demo_buf.size
    assert t.counters["relabeled"] == 20 and t.counters["rejected"] == 0  # half of the 40 steps conflict
    assert n == 40 and int(t.demo_buf.is_relabeled[:n].sum()) == 20
    legal = np.unpackbits(t.demo_buf.legal[:n], axis=-1, count=10).astype(bool)
    assert legal[np.arange(n), t.demo_buf.action[:n]].all()  # every stored demo action is legal
    relabeled = t.demo_buf.is_relabeled[:n]
    assert (t.demo_buf.action[:n][relabeled] != t.demo_buf.teacher_action[:n][relabeled]).all()
    r = Trainer(apply_overrides(base, {"replay.teacher_conflict": "reject"}), tmp_path / "reject",
                bundle=_bundle(ForbiddenTeacherEcho), progress=False)
    r.run()
    assert r.counters["rejected"] == 20 and r.counters["relabeled"] == 0
    assert r.demo_buf.size == 20 and r.agent_buf.size == 20  # rejected steps are the agent's
