"""The SAC agent: networks, optimisers, temperature, top-p controller and one update step.

The update described in docs/sac.md, read top to bottom: critic target (top-p expected backup, detached set) →
twin-critic Huber loss (+ CQL) → critic step → policy loss on the same or the full set (+ BC on demo
rows) → policy step → temperature step → Polyak.  The maths lives in :mod:`lmpo.textagent.sac.losses`.
Shapes: ``B`` transitions, ``M`` window, ``A`` actions, ``K`` candidates.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch

from lmpo.textagent.sac import losses as L
from lmpo.textagent.sac.config import NetworkConfig, SACConfig
from lmpo.textagent.sac.networks import PolicyNetwork, TwinQNetwork
from lmpo.textagent.sac.replay import ReplaySample


class SACAgent:
    """Discrete max-entropy SAC with top-p expected backups, CQL, BC and an adaptive temperature."""

    def __init__(self, num_actions: int, pad_id: int, net: NetworkConfig, sac: SACConfig, *,
                 seed: int = 0, device: str | torch.device = "cpu", total_updates: int = 0) -> None:
        sac.validate()
        self.num_actions, self.pad_id, self.net_cfg, self.cfg = num_actions, pad_id, net, sac
        self.device = torch.device(device)
        torch.manual_seed(seed)
        self.policy = PolicyNetwork(num_actions, pad_id, net).to(self.device)
        self.critic = TwinQNetwork(num_actions, pad_id, net).to(self.device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.opt_policy = torch.optim.Adam(self.policy.parameters(), lr=sac.lr_policy)
        self.opt_q = torch.optim.Adam(self.critic.parameters(), lr=sac.lr_q)
        self.log_alpha = torch.tensor(math.log(sac.alpha_init), device=self.device)
        self.controller = L.TopPController(
            sac.top_p, sac.top_p_k_max, coverage_target=sac.top_p_coverage_target,
            k_limit=sac.top_p_k_limit, enabled=sac.top_p_auto_raise and sac.use_top_p,
        )
        # CQL sampling and action sampling draw from their own generators: reproducible and resumable
        self.gen = torch.Generator(device=self.device).manual_seed(seed + 1)
        self.ref_policy: PolicyNetwork | None = None
        self.total_updates = max(1, total_updates)  # the cosine schedule's length (SACTrainConfig checks it is set)
        self.updates = 0
        self.nonfinite_skips = 0
        self.nonfinite_in_row = 0

    def init_from_reference(self, state: dict[str, torch.Tensor]) -> None:
        """Start the policy from the supervised reference and keep a frozen copy for the anchor term."""
        self.policy.load_state_dict(state)
        self.ref_policy = copy.deepcopy(self.policy).requires_grad_(False).eval()
        # Adam's moments must describe the new starting point, not the random one
        self.opt_policy = torch.optim.Adam(self.policy.parameters(), lr=self.cfg.lr_policy)

    # ------------------------------------------------------------------ acting
    @torch.no_grad()
    def act(self, window: np.ndarray, legal: np.ndarray, greedy: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """window (N, M), legal (N, A) → actions (N,), max π (N,)."""
        self.policy.eval()
        w = torch.as_tensor(window, dtype=torch.long, device=self.device)
        m = torch.as_tensor(legal, dtype=torch.bool, device=self.device)
        probs, _ = self.policy(w, m)
        self.policy.train()
        if greedy:
            actions = probs.argmax(-1)
        else:
            actions = torch.multinomial(probs, 1, generator=self.gen).squeeze(-1)
        return actions.cpu().numpy(), probs.max(-1).values.cpu().numpy()

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.exp()

    def _candidates(self, probs: torch.Tensor, log_probs: torch.Tensor, legal: torch.Tensor,
                    use_top_p: bool) -> L.TopPSet:
        if use_top_p:
            return L.top_p_set(probs, self.controller.p, self.controller.k_max)
        return L.full_set(probs, log_probs, legal)

    def _q_on(self, net: TwinQNetwork, ctx: torch.Tensor, cand: L.TopPSet, full: bool):
        if full:  # K = A: evaluate every action once per state (the action part once for all states)
            return net.all_actions(ctx)
        return net(ctx, cand.indices)

    # ------------------------------------------------------------------ update
    def update(self, batch: ReplaySample,
               text_batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """One critic + actor + temperature step on ``batch``; returns detached 0-dim statistics.

        ``text_batch`` = (windows (T, M), legal masks (T, A), next characters (T,)) of the training text: its
        cross-entropy joins the BC term (``sac.bc_text_batch``).
        """
        cfg = self.cfg
        alpha = self.alpha.detach()
        stats: dict[str, torch.Tensor] = {}

        # ---- critic target: y = r + γ(1 − terminated) Σ_P π_p (min Q'(s', a) − α log π_p)
        with torch.no_grad():
            probs_n, logp_n = self.policy(batch.next_obs, batch.next_legal)
            cand_n = self._candidates(probs_n, logp_n, batch.next_legal, cfg.use_top_p)
            ctx_n = self.critic_target.context(batch.next_obs)
            q1_t, q2_t = self._q_on(self.critic_target, ctx_n, cand_n, not cfg.use_top_p)
            q_min_t = torch.min(q1_t, q2_t)
            v_next = L.soft_value(cand_n, q_min_t, alpha)
            y = L.soft_td_target(batch.reward, batch.terminated, v_next, cfg.gamma)

        # ---- twin critics at the data action, Huber, optional CQL
        ctx = self.critic.context(batch.obs)
        q1, q2 = self.critic(ctx, batch.action.unsqueeze(-1))
        q1, q2 = q1.squeeze(-1), q2.squeeze(-1)
        loss_q, cstats = L.critic_loss(q1, q2, y, cfg.huber_delta)
        stats.update(cstats)
        cql_term = torch.zeros((), device=self.device)
        if cfg.use_cql and cfg.cql_weight > 0:
            exact = cfg.cql_mode == "exact" or (
                cfg.cql_mode == "auto" and self.num_actions <= cfg.cql_exact_max_actions
            )
            if exact:
                q1_all, q2_all = self.critic.all_actions(ctx)
                cql1 = L.cql_exact(q1_all, batch.legal, q1)
                cql2 = L.cql_exact(q2_all, batch.legal, q2)
            else:
                idx = L.sample_legal_actions(batch.legal, cfg.cql_samples, generator=self.gen,
                                              exclude=batch.action)
                q1_s, q2_s = self.critic(ctx, idx)
                count = batch.legal.sum(-1)
                cql1, cql2 = L.cql_sampled(q1_s, count, q1), L.cql_sampled(q2_s, count, q2)
            cql_term = (cql1 + cql2).mean()
        loss_q_total = loss_q + cfg.cql_weight * cql_term * float(cfg.use_cql)

        # ---- policy: Σ π (α log π − min Q) over the top-p set or the full legal set, + λ_BC · BC(demo)
        # a frozen warm-up: re-fitting the twin's own data at a fresh learning rate only moves it off its optimum;
        # its losses are still computed for the log, without an autograd graph (the same forwards and RNG draws)
        policy_moves = not (cfg.policy_warmup == "frozen" and self.updates < cfg.policy_warmup_updates)
        with torch.set_grad_enabled(policy_moves):
            probs, logp = self.policy(batch.obs, batch.legal)
            use_top_p_pi = cfg.use_top_p and cfg.policy_set == "top_p"
            cand = self._candidates(probs, logp, batch.legal, use_top_p_pi)
            with torch.no_grad():
                # the critic context of this batch is reused (detached): one GRU pass fewer per update
                q1_c, q2_c = self._q_on(self.critic, ctx.detach(), cand, not use_top_p_pi)
                q_min_c = torch.min(q1_c, q2_c)
            loss_pi, pstats = L.policy_loss(cand, q_min_c, alpha)
            stats.update(pstats)
            # a relabelled demo row clones the legal character that was stepped, not the forbidden reference
            label = torch.where(batch.is_relabeled.bool(), batch.action, batch.teacher_action)
            bc_w = batch.is_demo.to(probs.dtype)
            if cfg.bc_rows == "all":
                bc_w = batch.legal.gather(-1, label.long().unsqueeze(-1)).squeeze(-1).to(probs.dtype)
            elif cfg.bc_rows == "none":
                bc_w = torch.zeros_like(bc_w)
            loss_bc = L.bc_loss(logp, label, bc_w)
            if text_batch is not None:
                _, logp_text = self.policy(text_batch[0], text_batch[1])
                ones = torch.ones_like(text_batch[2], dtype=logp.dtype)
                loss_bc = loss_bc + L.bc_loss(logp_text, text_batch[2], ones)
            # the critics start random: until policy_warmup_updates the policy learns from BC and the anchor only
            # (or not at all, policy_warmup "frozen")
            rl_on = float(self.updates >= cfg.policy_warmup_updates)
            loss_pi_total = rl_on * loss_pi + cfg.bc_weight * loss_bc
            loss_anchor = torch.zeros((), device=self.device)
            if self.ref_policy is not None and cfg.anchor_weight > 0:
                with torch.no_grad():
                    ref_probs, ref_logp = self.ref_policy(batch.obs, batch.legal)
                loss_anchor = L.anchor_kl(ref_probs, ref_logp, logp)
                loss_pi_total = loss_pi_total + cfg.anchor_weight * loss_anchor

        # a function of the update count only, so a resumed run continues on the same curve
        decay = 0.5 * (1.0 + math.cos(math.pi * min(self.updates, self.total_updates) / self.total_updates))
        for opt, base, schedule in ((self.opt_policy, cfg.lr_policy, cfg.lr_policy_schedule),
                                    (self.opt_q, cfg.lr_q, cfg.lr_q_schedule)):
            if schedule == "cosine":
                for group in opt.param_groups:
                    group["lr"] = base * decay

        # ---- non-finite guard: skip the whole update (both nets) if anything is not finite
        finite = torch.isfinite(loss_q_total) & torch.isfinite(loss_pi_total)
        if not bool(finite):
            return self._skip(stats)
        self.opt_q.zero_grad(set_to_none=True)
        loss_q_total.backward()
        gn_q = torch.nn.utils.clip_grad_norm_(self.critic.parameters(), cfg.grad_clip)
        self.opt_policy.zero_grad(set_to_none=True)
        gn_pi = torch.zeros((), device=self.device)
        if policy_moves:
            loss_pi_total.backward()
            gn_pi = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.grad_clip)
        if not bool(torch.isfinite(gn_q) & torch.isfinite(gn_pi)):
            self.opt_q.zero_grad(set_to_none=True)
            self.opt_policy.zero_grad(set_to_none=True)
            return self._skip(stats)
        self.opt_q.step()
        if policy_moves:
            self.opt_policy.step()
        self.nonfinite_in_row = 0

        # ---- temperature: log α += η (H_tgt − H), clamped to [log α_min, log α_max]
        ent = L.entropy(probs.detach(), logp.detach())
        h_tgt = L.target_entropy(batch.legal, cfg.entropy_kappa)
        if cfg.autotune_alpha:
            self.log_alpha = L.temperature_step(self.log_alpha, ent, h_tgt, cfg.lr_alpha,
                                                cfg.alpha_min, cfg.alpha_max)
        L.polyak_update(self.critic_target, self.critic, cfg.tau)
        self.updates += 1

        # ---- coverage controller (host sync on two scalars)
        cov_mean = cand_n.coverage.mean()
        capped = cand_n.capped.float().mean()
        if cfg.use_top_p:
            self.controller.observe(float(cov_mean), float(capped))

        with torch.no_grad():
            teacher_logp = logp.detach().gather(-1, batch.teacher_action.unsqueeze(-1)).squeeze(-1)
            hit = (probs.detach().argmax(-1) == batch.teacher_action).float()
            stats.update({
                "losses/critic": loss_q.detach(),
                "losses/cql": cql_term.detach(),
                "losses/policy": loss_pi.detach(),
                "losses/bc": loss_bc.detach(),
                "losses/anchor_kl": loss_anchor.detach(),
                "losses/lr_policy": torch.tensor(self.opt_policy.param_groups[0]["lr"]),
                "losses/lr_q": torch.tensor(self.opt_q.param_groups[0]["lr"]),
                "losses/grad_norm_q": gn_q.detach(),
                "losses/grad_norm_pi": gn_pi.detach(),
                "policy/entropy": ent.mean(),
                "policy/target_entropy": h_tgt.mean(),
                "policy/alpha": self.alpha.detach(),
                "policy/max_prob": probs.detach().max(-1).values.mean(),
                "policy/top_p_coverage": cov_mean,
                "policy/top_p_capped_fraction": capped,
                "policy/top_p_set_size": cand_n.size.float().mean(),
                "policy/top_p": torch.tensor(self.controller.p),
                "policy/top_p_k_max": torch.tensor(float(self.controller.k_max)),
                "value/q2_mean": q2.detach().mean(),
                "value/target_q_mean": (cand_n.probs * q_min_t).sum(-1).mean(),
                "value/target_q_var": q_min_t[cand_n.member].var(unbiased=False),
                "value/next_v_mean": v_next.mean(),
                "data/demo_share": batch.is_demo.float().mean(),
                # KL(teacher‖π) = −log π(c_t|o) for a deterministic teacher (KL(π‖δ) would be +∞)
                "data/kl_teacher_pi": -teacher_logp.mean(),
                "data/batch_teacher_top1": hit.mean(),
                "data/batch_relabel_rate": batch.is_relabeled.float().mean(),
                "losses/nonfinite_skips": torch.tensor(float(self.nonfinite_skips)),
            })
        return stats

    def _skip(self, stats: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        self.nonfinite_skips += 1
        self.nonfinite_in_row += 1
        if self.nonfinite_in_row >= self.cfg.max_nonfinite_in_row:
            raise FloatingPointError(
                f"{self.nonfinite_in_row} consecutive SAC updates had non-finite losses or gradients "
                f"(after {self.updates} good updates); lower the learning rates or sac.grad_clip, or check "
                "the rewards for inf/NaN"
            )
        stats["losses/nonfinite_skips"] = torch.tensor(float(self.nonfinite_skips))
        return stats

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        return {
            "policy": self.policy.state_dict(), "critic": self.critic.state_dict(),
            "critic_target": self.critic_target.state_dict(),
            "opt_policy": self.opt_policy.state_dict(), "opt_q": self.opt_q.state_dict(),
            "log_alpha": self.log_alpha.detach().cpu(), "controller": self.controller.state_dict(),
            "gen": self.gen.get_state(), "updates": self.updates, "nonfinite_skips": self.nonfinite_skips,
        }

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        self.critic.load_state_dict(state["critic"])
        self.critic_target.load_state_dict(state["critic_target"])
        self.opt_policy.load_state_dict(state["opt_policy"])
        self.opt_q.load_state_dict(state["opt_q"])
        self.log_alpha = state["log_alpha"].to(self.device)
        self.controller.load_state_dict(state["controller"])
        self.gen.set_state(state["gen"])
        self.updates = int(state["updates"])
        self.nonfinite_skips = int(state["nonfinite_skips"])
