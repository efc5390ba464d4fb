"""Policy and twin-critic networks of the character-level SAC agent (docs/sac.md).

Shapes: ``B`` states, ``M`` window length (characters), ``A`` actions (|Σ|), ``K`` candidate actions per
state, ``E`` character-embedding width (d), ``H`` GRU width.
"""

from __future__ import annotations

import torch
from torch import nn

from lmpo.textagent.sac.config import NetworkConfig
from lmpo.textagent.sac.losses import masked_policy


class WindowEncoder(nn.Module):
    """Character embedding (d) + GRU (H) over the observation window → context c (B, H).

    The window is left-padded with ``pad_id``; the GRU reads it left to right and c is its last hidden
    state, i.e. a summary of the most recent M characters (u_t in docs/sac.md).  Padding embeds to zeros
    (``padding_idx``) so a short history and a zero prefix look alike.
    """

    def __init__(self, num_actions: int, pad_id: int, cfg: NetworkConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(num_actions, cfg.embed_dim, padding_idx=pad_id)
        self.gru = nn.GRU(cfg.embed_dim, cfg.gru_hidden, num_layers=cfg.gru_layers, batch_first=True)
        self.drop = nn.Dropout(cfg.dropout)
        self.norm = nn.LayerNorm(cfg.gru_hidden)

    def forward(self, window: torch.Tensor) -> torch.Tensor:
        x = self.drop(self.embed(window.long()))  # (B, M, E)
        _, h = self.gru(x)  # h: (layers, B, H)
        return self.norm(self.drop(h[-1]))  # (B, H)


class PolicyNetwork(nn.Module):
    """π(a|o): encoder → MLP → logits over Σ → stable masking (:func:`lmpo.textagent.sac.losses.masked_policy`)."""

    def __init__(self, num_actions: int, pad_id: int, cfg: NetworkConfig) -> None:
        super().__init__()
        self.encoder = WindowEncoder(num_actions, pad_id, cfg)
        self.head = nn.Sequential(
            nn.Linear(cfg.gru_hidden, cfg.policy_hidden), nn.ReLU(), nn.Linear(cfg.policy_hidden, num_actions)
        )

    def logits(self, window: torch.Tensor) -> torch.Tensor:
        """window (B, M) → logits (B, A) (unmasked)."""
        return self.head(self.encoder(window))

    def forward(self, window: torch.Tensor, legal_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """window (B, M), legal_mask (B, A) → probs (B, A) (0 on illegal), log_probs (B, A)."""
        return masked_policy(self.logits(window), legal_mask)


class QHead(nn.Module):
    """Q(o, a) = w_out · ReLU(W_c c + W_a Emb_act(a) + b) + b_out — the MLP on [c; Emb_act(a)].

    The first layer of ``MLP([c; e_a])`` is split as ``W_c c + W_a e_a``: the context part is computed once
    per state and the action part once per distinct action, so evaluating K candidates costs one add and
    the small output layer per candidate instead of a full MLP on a (B·K, H+E) concatenation.
    Naive equivalent: ``mlp(torch.cat([c.expand(K), emb(a)], -1))`` with ``W = [W_c | W_a]``.
    """

    def __init__(self, num_actions: int, cfg: NetworkConfig) -> None:
        super().__init__()
        self.action_embed = nn.Embedding(num_actions, cfg.action_embed_dim)
        self.ctx_proj = nn.Linear(cfg.gru_hidden, cfg.q_hidden)
        self.act_proj = nn.Linear(cfg.action_embed_dim, cfg.q_hidden, bias=False)
        self.out = nn.Linear(cfg.q_hidden, 1)

    def forward(self, context: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """context (B, H), actions (B, K) ids → Q (B, K)."""
        ctx = self.ctx_proj(context).unsqueeze(1)  # (B, 1, Hq)
        act = self.act_proj(self.action_embed(actions.long()))  # (B, K, Hq)
        return self.out(torch.relu(ctx + act)).squeeze(-1)  # (B, K)

    def all_actions(self, context: torch.Tensor) -> torch.Tensor:
        """context (B, H) → Q on every action (B, A); the action part is computed once for all states."""
        ctx = self.ctx_proj(context).unsqueeze(1)  # (B, 1, Hq)
        act = self.act_proj(self.action_embed.weight).unsqueeze(0)  # (1, A, Hq)
        return self.out(torch.relu(ctx + act)).squeeze(-1)  # (B, A)


class TwinQNetwork(nn.Module):
    """Twin critics Q_1, Q_2 on a shared critic encoder (separate from the policy's encoder).

    Sharing the encoder between the two heads halves the GRU cost; the heads (and their action
    embeddings) are independent, which is what the min over the twins needs to damp over-estimation.
    """

    def __init__(self, num_actions: int, pad_id: int, cfg: NetworkConfig) -> None:
        super().__init__()
        self.encoder = WindowEncoder(num_actions, pad_id, cfg)
        self.q1 = QHead(num_actions, cfg)
        self.q2 = QHead(num_actions, cfg)

    def context(self, window: torch.Tensor) -> torch.Tensor:
        return self.encoder(window)  # (B, H)

    def forward(self, context: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """context (B, H), actions (B, K) → (Q_1, Q_2) each (B, K)."""
        return self.q1(context, actions), self.q2(context, actions)

    def all_actions(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """context (B, H) → (Q_1, Q_2) each (B, A)."""
        return self.q1.all_actions(context), self.q2.all_actions(context)
