"""InfoNCE reward: online encoder f, EMA target encoder f̄, a queue of negative keys (MoCo-style).

Encoder (tiny, so that it can be scored per step in numpy). With char embedding ``E`` (A, h), position
gates ``P_q`` (L, h) / ``P_k`` (n, h) (position counted from the right for the query, from the left for
the key) and projections ``W_q``, ``W_k`` (h, d)::

    f_q(x_1..x_L) = normalise( tanh( Σ_i E[x_i] ⊙ P_q[L-i] ) · W_q )        query: a context window
    f_k(g_1..g_n) = normalise( tanh( Σ_j E[g_j] ⊙ P_k[j] ) · W_k )          key: an n-gram

Training (``InfoNCEModel.train_step``), on reference pairs (context window of L characters ending at q →
the next n-gram q+1..q+n): queries from the online encoder f, keys from the target encoder f̄ (no
gradient), logits = [q·k_batch ; q·queue] / τ, cross-entropy towards the diagonal (in-batch keys and
the queue are the negatives; a negative equal to the positive n-gram is masked out), averaged with the
symmetric term (online keys against the batch's target queries, so that f's key branch learns too),
Adam on f, then ``f̄ ← m·f̄ + (1−m)·f`` and the batch keys enter the FIFO queue.

Reward (``InfoNCEScorer.score``), after the environment appended a character at chapter position ``pos``:
query = f_q(last L characters of the agent's history), positive = f̄_k(reference n-gram ``pos+1..pos+n``),
negatives = the scorer's queue of past positive keys (K of them)::

    nce_t = log softmax_0( [cos(q, k⁺), cos(q, k⁻_1), …, cos(q, k⁻_K)] / τ )   ∈ [−log(K+1)−2/τ, 0]

Speed: the target keys of every reference position of a chapter are computed once per encoder version in
one batched call and cached; the per-step score is about a dozen numpy operations on (L, h), (h, d) and
(K, d) arrays without autograd (≈ 25 µs on one core), so no batching across steps is needed for
≥ 5,000 steps/s (``score_batch`` scores many windows at once for evaluation).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from lmpo.textagent.env.config import InfoNCEConfig


class _Adam:
    """Plain Adam (Kingma & Ba 2015, bias-corrected) on a few tensors.

    ``torch.optim.Adam`` would do the same, but importing it pulls in ``torch._dynamo`` (seconds of start-up
    for every process that builds an environment).
    """

    def __init__(self, params: list[torch.Tensor], lr: float, betas=(0.9, 0.999), eps: float = 1e-8) -> None:
        self.params, self.lr, self.betas, self.eps = params, lr, betas, eps
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]
        self.t = 0

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        b1, b2 = self.betas
        c1, c2 = 1 - b1**self.t, 1 - b2**self.t
        for p, m, v in zip(self.params, self.m, self.v):
            if p.grad is None:
                continue
            m.mul_(b1).add_(p.grad, alpha=1 - b1)
            v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
            p.addcdiv_(m / c1, (v / c2).sqrt_().add_(self.eps), value=-self.lr)


class ContrastiveEncoder(nn.Module):
    """f: the query / key encoder of the module docstring (torch, for training)."""

    def __init__(self, num_chars: int, cfg: InfoNCEConfig) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(cfg.seed)
        h, d = cfg.hidden_dim, cfg.embed_dim
        self.emb = nn.Parameter(torch.randn(num_chars, h, generator=g) * 0.5)
        self.pos_q = nn.Parameter(1.0 + 0.1 * torch.randn(cfg.context_chars, h, generator=g))
        self.pos_k = nn.Parameter(1.0 + 0.1 * torch.randn(cfg.ngram_n, h, generator=g))
        self.w_q = nn.Parameter(torch.randn(h, d, generator=g) / h**0.5)
        self.w_k = nn.Parameter(torch.randn(h, d, generator=g) / h**0.5)

    def query(self, ctx: torch.Tensor) -> torch.Tensor:
        """ctx (B, L) ids, oldest first → (B, d) unit vectors."""
        x = torch.tanh((self.emb[ctx] * self.pos_q).sum(1))  # (B, h)
        return nn.functional.normalize(x @ self.w_q, dim=-1)

    def key(self, gram: torch.Tensor) -> torch.Tensor:
        """gram (B, n) ids → (B, d) unit vectors."""
        x = torch.tanh((self.emb[gram] * self.pos_k).sum(1))
        return nn.functional.normalize(x @ self.w_k, dim=-1)


def _windows(ext: np.ndarray, ends: np.ndarray, length: int, pad_id: int) -> np.ndarray:
    """(B, length) ids ext[e-length+1 .. e] for each end e, left-padded with pad_id."""
    idx = ends[:, None] + np.arange(-length + 1, 1)[None, :]
    out = ext[np.clip(idx, 0, len(ext) - 1)]
    out[idx < 0] = pad_id
    return out


def _next_grams(ext: np.ndarray, pos: np.ndarray, n: int, pad_id: int) -> np.ndarray:
    """(B, n) ids ext[p+1 .. p+n], right-padded with pad_id past the end."""
    idx = pos[:, None] + np.arange(1, n + 1)[None, :]
    out = ext[np.clip(idx, 0, len(ext) - 1)]
    out[idx >= len(ext)] = pad_id
    return out


class InfoNCEModel:
    """Online encoder, EMA target encoder, training queue and the training step.

    Arguments:
        num_chars: A, the alphabet size.
        cfg: ``InfoNCEConfig``.
        pad_id: id used to pad windows and n-grams.
    """

    def __init__(self, num_chars: int, cfg: InfoNCEConfig = InfoNCEConfig(), pad_id: int = 0) -> None:
        self.cfg, self.num_chars, self.pad_id = cfg, num_chars, pad_id
        self.online = ContrastiveEncoder(num_chars, cfg)
        self.target = ContrastiveEncoder(num_chars, cfg)
        self.target.load_state_dict(self.online.state_dict())
        self.target.requires_grad_(False)
        self.opt = _Adam(list(self.online.parameters()), lr=cfg.lr)
        self.rng = np.random.default_rng(cfg.seed)
        self.queue = torch.zeros(0, cfg.embed_dim)  # (≤K, d) target keys
        self.queue_ids = torch.zeros(0, dtype=torch.long)  # n-gram keys, to mask false negatives
        #: bumped on every training step; scorers re-export their numpy weights when it changes
        self.version = 0
        self.steps_trained = 0

    def _gram_ids(self, grams: np.ndarray) -> np.ndarray:
        k = np.zeros(len(grams), dtype=np.int64)
        for j in range(grams.shape[1]):
            k = k * self.num_chars + grams[:, j]
        return k

    def train_step(self, chapters_ids: Sequence[np.ndarray]) -> dict[str, float]:
        """One InfoNCE step on random reference pairs from ``chapters_ids`` (each an int array of ids).

        Returns ``{"infonce/loss": …, "infonce/accuracy": …}`` (accuracy = positive ranked first).
        """
        cfg = self.cfg
        lengths = np.array([len(c) for c in chapters_ids])
        if lengths.sum() < 2:
            raise ValueError("InfoNCE training needs reference text of at least 2 characters")
        # positions q with at least one next character: 0 .. len-2 per chapter, sampled uniformly
        valid = np.maximum(lengths - 1, 0)
        cum = np.cumsum(valid)
        flat = self.rng.integers(0, cum[-1], size=cfg.pairs_per_step)
        chap = np.searchsorted(cum, flat, side="right")
        pos = flat - np.concatenate([[0], cum[:-1]])[chap]
        ctx = np.empty((cfg.pairs_per_step, cfg.context_chars), dtype=np.int64)
        grams = np.empty((cfg.pairs_per_step, cfg.ngram_n), dtype=np.int64)
        for c in np.unique(chap):
            sel = np.flatnonzero(chap == c)
            ctx[sel] = _windows(chapters_ids[c], pos[sel], cfg.context_chars, self.pad_id)
            grams[sel] = _next_grams(chapters_ids[c], pos[sel], cfg.ngram_n, self.pad_id)
        gram_ids = torch.from_numpy(self._gram_ids(grams))
        ctx_t, grams_t = torch.from_numpy(ctx), torch.from_numpy(grams)

        q = self.online.query(ctx_t)  # (B, d)
        k_online = self.online.key(grams_t)  # (B, d)
        with torch.no_grad():
            k = self.target.key(grams_t)  # (B, d)
            q_target = self.target.query(ctx_t)  # (B, d)
        keys = torch.cat([k, self.queue], 0)  # (B+K, d)
        key_ids = torch.cat([gram_ids, self.queue_ids], 0)
        logits = q @ keys.T / cfg.tau  # (B, B+K)
        same = gram_ids[:, None] == key_ids[None, :]
        diag = torch.zeros_like(same)
        diag[:, : len(k)] = torch.eye(len(k), dtype=torch.bool)
        logits = logits.masked_fill(same & ~diag, float("-inf"))  # identical n-gram ≠ negative
        labels = torch.arange(len(k))
        # symmetric term (key → its context among the batch's target queries) so that the key branch of f
        # gets gradients too; f̄'s key branch is what scores the reward
        logits_k = k_online @ q_target.T / cfg.tau  # (B, B)
        logits_k = logits_k.masked_fill(same[:, : len(k)] & ~diag[:, : len(k)], float("-inf"))
        loss = 0.5 * (
            nn.functional.cross_entropy(logits, labels) + nn.functional.cross_entropy(logits_k, labels)
        )
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        with torch.no_grad():
            for pt, po in zip(self.target.parameters(), self.online.parameters()):
                pt.mul_(cfg.momentum).add_(po, alpha=1.0 - cfg.momentum)
            self.queue = torch.cat([k, self.queue], 0)[: cfg.queue_size]
            self.queue_ids = torch.cat([gram_ids, self.queue_ids], 0)[: cfg.queue_size]
            acc = (logits.argmax(1) == labels).float().mean()
        self.version += 1
        self.steps_trained += 1
        return {"infonce/loss": float(loss.detach()), "infonce/accuracy": float(acc)}

    def train(self, chapters_ids: Sequence[np.ndarray], steps: int) -> dict[str, float]:
        """``steps`` training steps; returns the last step's metrics.

        Runs on one intra-op thread (restored afterwards): the model is tiny, and extra threads only
        contend with the agent's own work.
        """
        stats: dict[str, float] = {}
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            for _ in range(steps):
                stats = self.train_step(chapters_ids)
        finally:
            torch.set_num_threads(threads)
        return stats

    def state_dict(self) -> dict:
        """Weights, optimiser moments, RNG and queue as plain data (tensors, arrays, numbers)."""
        return {"online": self.online.state_dict(), "target": self.target.state_dict(),
                "adam": {"m": list(self.opt.m), "v": list(self.opt.v), "t": self.opt.t},
                "rng": self.rng.bit_generator.state, "queue": self.queue, "queue_ids": self.queue_ids,
                "version": self.version, "steps_trained": self.steps_trained}

    def load_state_dict(self, state: dict) -> None:
        self.online.load_state_dict(state["online"])
        self.target.load_state_dict(state["target"])
        with torch.no_grad():
            for mine, saved in zip(self.opt.m + self.opt.v, list(state["adam"]["m"]) + list(state["adam"]["v"])):
                mine.copy_(saved)
        self.opt.t = int(state["adam"]["t"])
        self.rng.bit_generator.state = state["rng"]
        self.queue, self.queue_ids = state["queue"].clone(), state["queue_ids"].clone()
        self.version, self.steps_trained = int(state["version"]), int(state["steps_trained"])

    def export(self) -> dict[str, np.ndarray]:
        """numpy copies of the online query weights and the target key weights (for scoring)."""
        on, tg = self.online, self.target
        with torch.no_grad():
            return {
                "emb_q": on.emb.detach().numpy().copy(),
                "pos_q": on.pos_q.detach().numpy().copy(),
                "w_q": on.w_q.detach().numpy().copy(),
                "emb_k": tg.emb.detach().numpy().copy(),
                "pos_k": tg.pos_k.detach().numpy().copy(),
                "w_k": tg.w_k.detach().numpy().copy(),
                "queue": self.queue.numpy().copy(),
                "queue_ids": self.queue_ids.numpy().copy(),
            }


def _normalise(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


class InfoNCEScorer:
    """Per-step ``nce_t`` in numpy with cached target keys (see module docstring).

    Arguments:
        model: the ``InfoNCEModel`` whose weights are scored (re-exported when its version changes).
        chapters_ids: the environment's reference chapters as id arrays (the ``<eos>`` id appended).
    """

    def __init__(self, model: InfoNCEModel, chapters_ids: Sequence[np.ndarray]) -> None:
        self.model = model
        self.chapters_ids = [np.asarray(c, dtype=np.int64) for c in chapters_ids]
        self._version = -1
        self._refresh()

    def _refresh(self) -> None:
        m = self.model
        w = m.export()
        self._emb_q, self._pos_q, self._w_q = w["emb_q"], w["pos_q"], w["w_q"]
        self._emb_k, self._pos_k, self._w_k = w["emb_k"], w["pos_k"], w["w_k"]
        self._keys: dict[int, np.ndarray] = {}
        self._key_ids: dict[int, np.ndarray] = {}
        k_size = m.cfg.queue_size
        if len(w["queue"]) >= k_size:
            q0, q0_ids = w["queue"][:k_size], w["queue_ids"][:k_size]
        else:
            # untrained model: negatives = keys of K reference positions spread evenly over the chapters
            cum = np.cumsum([len(ids) for ids in self.chapters_ids])
            pick = np.linspace(0, cum[-1] - 1, num=k_size).astype(np.int64)
            chap = np.searchsorted(cum, pick, side="right")
            pos = pick - np.concatenate([[0], cum[:-1]])[chap]
            q0 = np.stack([self.chapter_keys(int(c))[p] for c, p in zip(chap, pos)])
            q0_ids = np.array([self._key_ids[int(c)][p] for c, p in zip(chap, pos)])
        self._queue0, self._queue0_ids = q0.astype(np.float64), q0_ids.astype(np.int64)
        self._version = m.version
        self.reset_queue()

    def reset_queue(self) -> None:
        """Restore the negative queue to its state right after the last encoder export."""
        self.queue = self._queue0.copy()
        self.queue_ids = self._queue0_ids.copy()
        self._ptr = 0

    def state_dict(self) -> dict:
        """The negative queue of the current episode and the encoder version it was exported from."""
        return {"version": self._version, "queue0": self._queue0, "queue0_ids": self._queue0_ids,
                "queue": self.queue, "queue_ids": self.queue_ids, "ptr": self._ptr}

    def load_state_dict(self, state: dict) -> None:
        """Restore after the model's own state (weights are re-exported from it)."""
        self._refresh()
        self._queue0, self._queue0_ids = state["queue0"].copy(), state["queue0_ids"].copy()
        self.queue, self.queue_ids = state["queue"].copy(), state["queue_ids"].copy()
        self._ptr, self._version = int(state["ptr"]), int(state["version"])

    def sync(self) -> None:
        """Re-export weights and drop cached keys if the model trained since the last export."""
        if self.model.version != self._version:
            self._refresh()

    def chapter_keys(self, chapter: int) -> np.ndarray:
        """(len+1... , d) target keys of the next n-gram after every position of a chapter (cached)."""
        keys = self._keys.get(chapter)
        if keys is None:
            ext = self.chapters_ids[chapter]
            pos = np.arange(len(ext))
            grams = _next_grams(ext, pos, self.model.cfg.ngram_n, self.model.pad_id)
            x = np.tanh((self._emb_k[grams] * self._pos_k).sum(1))
            keys = _normalise(x @ self._w_k)
            self._keys[chapter] = keys
            self._key_ids[chapter] = self.model._gram_ids(grams)
        return keys

    def query(self, window: Sequence[int]) -> np.ndarray:
        """(d,) unit query of the last L ids of ``window`` (left-padded)."""
        L = self.model.cfg.context_chars
        ids = window[-L:]
        if len(ids) < L:
            ids = [self.model.pad_id] * (L - len(ids)) + list(ids)
        x = np.tanh(np.einsum("lh,lh->h", self._emb_q.take(ids, axis=0), self._pos_q))
        v = x @ self._w_q
        return v / max(math.sqrt(v @ v), 1e-12)

    def score(self, window: Sequence[int], chapter: int, pos: int, enqueue: bool = True) -> float:
        """``nce_t`` for the agent window against the reference n-gram after ``pos`` of ``chapter``."""
        keys = self._keys.get(chapter)
        if keys is None:
            keys = self.chapter_keys(chapter)
        k_pos = keys[pos]
        kid = self._key_ids[chapter][pos]
        q = self.query(window) * (1.0 / self.model.cfg.tau)  # fold 1/τ into the query: one scaling
        s_pos = float(k_pos @ q)
        s_neg = self.queue @ q  # (K,)
        s_neg[self.queue_ids == kid] = -np.inf  # the same n-gram is not a negative
        mx = max(s_pos, float(s_neg.max()))
        nce = s_pos - mx - math.log(math.exp(s_pos - mx) + float(np.exp(s_neg - mx).sum()))
        if enqueue:
            self.queue[self._ptr] = k_pos
            self.queue_ids[self._ptr] = kid
            self._ptr = (self._ptr + 1) % len(self.queue)
        return nce

    def score_batch(self, windows: np.ndarray, chapter: int, positions: np.ndarray) -> np.ndarray:
        """``nce`` for B windows (B, L) at once against the current queue (no enqueue); for evaluation."""
        keys = self.chapter_keys(chapter)
        k_pos = keys[positions]  # (B, d)
        kid = self._key_ids[chapter][positions]
        x = np.tanh((self._emb_q[windows] * self._pos_q).sum(1))
        q = _normalise(x @ self._w_q)  # (B, d)
        inv_tau = 1.0 / self.model.cfg.tau
        s_pos = (k_pos * q).sum(1) * inv_tau  # (B,)
        s_neg = q @ self.queue.T * inv_tau  # (B, K)
        s_neg = np.where(self.queue_ids[None, :] == kid[:, None], -np.inf, s_neg)
        allv = np.concatenate([s_pos[:, None], s_neg], 1)
        mx = allv.max(1, keepdims=True)
        return s_pos - (mx[:, 0] + np.log(np.exp(allv - mx).sum(1)))
