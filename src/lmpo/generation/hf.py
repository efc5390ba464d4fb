"""``HFRollout``: batched sampling from any Hugging Face causal LM, in time linear in the completion length.

One ``generate(prompts, G)`` call::

    prefill: the N distinct prompts once (N, P)  →  their keys/values written G times into buffers
             (B = N·G, heads, P + T, head dim) allocated once, the first logits repeated G times
    decode:  one token per step: keys/values written in place at the next position, attention reads the
             filled prefix (a view, no copy), the attention mask is a preallocated (B, P + T) buffer
    rows that produced EOS leave the decode batch (the buffers are compacted when a quarter of the rows in
    it have finished), sampling runs on the device with no host sync per token (``torch.multinomial``'s
    draw, written out so that nothing in it waits for the device).

The naive loop this replaces — every prompt pre-filled G times, the cache and mask grown by concatenation at
every step — copies the whole cache at every token (quadratic in T); its greedy output is what this loop
must reproduce (``tests/generation/test_hf.py`` checks it against a cache-free reference).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Sequence

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase
from transformers.cache_utils import Cache, DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import AttentionInterface

from lmpo.generation.lean import LeanDecoder, unsupported
from lmpo.generation.logprobs import position_ids_from_mask
from lmpo.generation.rollout import Rollout, SamplingEngine, completion_mask

# Compact the decode batch once this fraction of its rows has finished: each compaction copies the cache of
# the remaining rows once, and the geometric trigger bounds the copies to a few full caches per call.
_COMPACT_FINISHED_FRACTION = 0.25


class _BufferLayer(DynamicLayer):
    """One attention layer's keys and values in buffers allocated once for a whole ``generate`` call.

    Buffers: (B, heads, P + T, head dim). ``update`` writes the new positions in place and returns a view of
    the filled prefix. The first update is the prefill of the N = B / G distinct prompts: it fills the G rows
    of each prompt at once (a broadcast copy) and returns the N-row states for the prefill's own attention.
    """

    # Static buffers: tells Hugging Face's mask builder not to probe the padding mask with ``.all()``, which
    # would be a host sync at every decode step.
    is_compileable = True

    def __init__(self, batch: int, max_len: int, repeats: int) -> None:
        super().__init__()
        self.batch, self.max_len, self.repeats = batch, max_len, repeats
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        shape = (self.batch, key_states.shape[1], self.max_len)
        self.keys = key_states.new_empty((*shape, key_states.shape[-1]))
        self.values = value_states.new_empty((*shape, value_states.shape[-1]))
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self.length, self.length + key_states.shape[-2]
        if start == 0 and self.repeats > 1:  # prefill of the distinct prompts, shared by their G rows
            n, g = key_states.shape[0], self.repeats
            for buf, new in ((self.keys, key_states), (self.values, value_states)):
                rows = buf.view(n, g, *buf.shape[1:])  # (N, G, heads, L, d)
                rows[:, :, :, :end].copy_(new.unsqueeze(1))
            self.length = end
            return key_states, value_states
        self.keys[:, :, start:end].copy_(key_states)
        self.values[:, :, start:end].copy_(value_states)
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.keys = self.keys.index_select(0, indices)
        self.values = self.values.index_select(0, indices)
        self.batch = indices.numel()


class _StaticBufferLayer(_BufferLayer):
    """A ``_BufferLayer`` for a compiled decode step: no Python integer of it changes between decode steps.

    The prefill is the parent's. A decode step writes its key/value at ``position`` (a one-element tensor
    shared by all layers and advanced in place between steps) and returns the first ``view_len`` positions of
    the (B, heads, max_len, d) buffers, ``view_len`` being set inside the compiled step from the attention
    mask's length (a dynamic dimension). The buffers start zeroed, so that no position ever holds NaN.
    """

    def __init__(self, batch: int, max_len: int, repeats: int, position: torch.Tensor) -> None:
        super().__init__(batch, max_len, repeats)
        self.position = position
        self.decoding = False
        self.view_len = max_len  # positions a decode step attends over (set by the compiled step)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.keys.zero_()
        self.values.zero_()

    def reset(self) -> None:
        """Ready for the prefill of a new ``generate`` call (the buffers are reused as they are)."""
        self.length, self.decoding = 0, False

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.decoding:
            out = super().update(key_states, value_states, *args, **kwargs)
            self.decoding = True
            return out
        self.keys.index_copy_(2, self.position, key_states)
        self.values.index_copy_(2, self.position, value_states)
        return self.keys[:, :, : self.view_len], self.values[:, :, : self.view_len]


class _CompiledDecode:
    """One decode step (one token per row, keys/values in ``_StaticBufferLayer`` buffers) through
    ``torch.compile``: one graph per (batch, buffer length), the attended length being a dynamic dimension.

    The buffer length is P + T rounded up to a multiple of ``_STATIC_LEN_MULTIPLE``, so prompts of slightly
    different padded lengths reuse one compiled step and one cache, kept between ``generate`` calls (a call
    attends only to the positions it has written itself).
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.cache: Cache | None = None
        self.key: tuple | None = None
        self.position = torch.zeros(1, dtype=torch.long)
        self.step = torch.compile(self._step, dynamic=False)

    def _step(self, input_ids, mask, position_ids, cache):
        for layer in cache.layers:  # attend over the mask's length (a dynamic dimension: one compiled graph)
            layer.view_len = mask.shape[-1]
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, past_key_values=cache,
                         use_cache=True)
        return out.logits[:, -1]

    def cache_for(self, batch: int, max_len: int, repeats: int, device: torch.device) -> Cache:
        key = (batch, max_len, repeats, device)
        if self.cache is None or self.key != key:
            self.cache, self.position = _static_cache(self.model, batch, max_len, repeats, device)
            self.key = key
        return _reset(self.cache)


def _static_cache(model: nn.Module, batch: int, max_len: int, repeats: int,
                  device: torch.device) -> tuple[Cache, torch.Tensor]:
    """A cache of ``_StaticBufferLayer``s (one per layer) and the (1,) write position they share."""
    position = torch.zeros(1, dtype=torch.long, device=device)
    layers = model.config.get_text_config().num_hidden_layers
    return Cache(layers=[_StaticBufferLayer(batch, max_len, repeats, position) for _ in range(layers)]), position


def _reset(cache: Cache) -> Cache:
    """The cache, every layer rewound for a new prefill (the buffers are kept)."""
    for layer in cache.layers:
        layer.reset()
    return cache


# Static decode buffers are this many positions long, or a multiple of it.
_STATIC_LEN_MULTIPLE = 64
# A CUDA-graph decode step attends over a whole bucket of this many positions (the positions not yet written are
# masked): one graph per bucket instead of one per length, at most this many masked positions of extra reading.
_GRAPH_BUCKET = 256


class _GraphCaptureFailed(Exception):
    """A decode step could not be captured into a CUDA graph (the call is then redone eagerly)."""


class _GraphDecode:
    """One decode step (one token per row) replayed from CUDA graphs, the gpt-fast approach.

    Everything a step reads lives in buffers allocated once per (batch, buffer length): the token ids
    (B, 1), position ids (B, 1), the attention mask (B, L) and the keys/values in ``_StaticBufferLayer``
    buffers written at ``position``. A step attends over the first ``bucket`` positions, ``bucket`` the
    attended length rounded up to a multiple of ``_GRAPH_BUCKET`` (the positions beyond are masked), so a
    call of T tokens uses about (P + T) / 256 graphs, each captured the first time its bucket is reached and
    kept, with the buffers, for later calls of the same shape. The graphs share one memory pool.

    With ``capture=False`` (any non-CUDA device) the same fixed-shape step runs eagerly: the bucketing and
    the masking are then testable on CPU, and a CUDA device gets exactly that computation, replayed.
    """

    def __init__(self, model: nn.Module, capture: bool) -> None:
        self.model, self.capture = model, capture
        self.key: tuple | None = None
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph | None, torch.Tensor | None]] = {}
        self.pool = None

    def cache_for(self, batch: int, max_len: int, repeats: int, device: torch.device) -> Cache:
        """The static cache of this shape (new buffers and graphs when the shape changes), ready for a prefill."""
        key = (batch, max_len, repeats, device)
        if self.key != key:
            self.graphs.clear()
            self.pool = None
            self.cache, self.position = _static_cache(self.model, batch, max_len, repeats, device)
            self.input_ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
            self.position_ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
            self.mask = torch.zeros(batch, max_len, dtype=torch.bool, device=device)
            self.key = key
        return _reset(self.cache)

    def _forward(self, bucket: int) -> torch.Tensor:
        for layer in self.cache.layers:
            layer.view_len = bucket
        out = self.model(input_ids=self.input_ids, attention_mask=self.mask[:, None, None, :bucket],
                         position_ids=self.position_ids, past_key_values=self.cache, use_cache=True)
        return out.logits[:, -1]

    def step(self, next_ids: torch.Tensor, position_ids: torch.Tensor, position: int) -> torch.Tensor:
        """(B,) tokens at absolute cache slot ``position`` with (B, 1) position ids -> (B, V) next logits.

        The caller has set ``self.mask`` up to and including ``position``. The returned logits are the
        graph's output buffer: read them before the next step.
        """
        self.input_ids.copy_(next_ids[:, None])
        self.position_ids.copy_(position_ids)
        self.position.fill_(position)
        bucket = min(-(-(position + 1) // _GRAPH_BUCKET) * _GRAPH_BUCKET, self.mask.shape[1])
        if not self.capture:
            return self._forward(bucket)
        if bucket not in self.graphs:
            self.graphs[bucket] = self._capture(bucket)
        graph, logits = self.graphs[bucket]
        graph.replay()
        return logits

    def _capture(self, bucket: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        # warm-up runs on a side stream (as torch.cuda.graphs' docs ask) with the step's real inputs: each
        # writes this step's keys/values, which the replay below writes again, identically
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._forward(bucket)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self._forward(bucket)
        self.pool = graph.pool()
        return graph, logits



def _decode_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """SDPA, except for one query per row: two batched matmuls, the query heads grouped under their key/value
    head (the cache is read once).

    On CPU, PyTorch's flash-attention kernel takes ~15× the time of its arithmetic at query length 1 (it tiles
    the query axis). On CUDA, SDPA with a mask and grouped-query heads falls back (in Hugging Face's
    ``sdpa_attention_forward``) to copying the keys and values H / H_kv times and the math kernel: at 2k
    positions that copy was most of a decode step (0.5B Qwen2, 128 rows, H100). Shapes: query (B, H, 1, d),
    key/value (B, H_kv, L, d), mask (B, 1, 1, L) bool (True = attend); returns (B, 1, H, d).
    """
    if query.shape[2] != 1 or kwargs.get("output_attentions"):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    if torch.compiler.is_compiling():
        # an opaque call inside the compiled decode step: inductor would otherwise lower these matrix-vector
        # products (query length 1) to generated loops, which were slower than these BLAS calls on CPU
        return _decode_attention_op(query, key, value, attention_mask, scaling), None
    return _decode_attention_math(query, key, value, attention_mask, scaling), None


def _decode_attention_math(query, key, value, attention_mask, scaling: float) -> torch.Tensor:
    B, H, _, d = query.shape
    kv_heads = key.shape[1]
    q = query.view(B, kv_heads, H // kv_heads, d)  # query heads grouped under their key/value head
    scores = torch.matmul(q, key.transpose(-1, -2)).float()  # (B, H_kv, H/H_kv, L)
    scores.mul_(scaling)
    if attention_mask is not None:
        scores.masked_fill_(~attention_mask, float("-inf"))  # (B, 1, 1, L) broadcast over heads
    probs = scores.softmax(-1).to(value.dtype)
    return torch.matmul(probs, value).view(B, 1, H, d)


@torch.library.custom_op("lmpo::decode_attention", mutates_args=())
def _decode_attention_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attention_mask: torch.Tensor | None, scaling: float) -> torch.Tensor:
    return _decode_attention_math(query, key, value, attention_mask, scaling)


@_decode_attention_op.register_fake
def _(query, key, value, attention_mask, scaling):
    B, H, _, d = query.shape
    return query.new_empty(B, 1, H, d)


# Registered under a name of its own, used only while ``HFRollout`` samples from a model configured for SDPA.
_DECODE_ATTENTION = "lmpo_sdpa_decode"
AttentionInterface.register(_DECODE_ATTENTION, _decode_attention)
AttentionMaskInterface.register(_DECODE_ATTENTION, sdpa_mask)


def _buffer_cache(model: nn.Module, batch: int, max_len: int, repeats: int) -> Cache:
    layers = model.config.get_text_config().num_hidden_layers
    return Cache(layers=[_BufferLayer(batch, max_len, repeats) for _ in range(layers)])


def _filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """(B, V) logits with tokens outside the top-k and outside the nucleus of mass ``top_p`` set to −inf.

    Nucleus: keep the smallest set of most probable tokens whose probability sum reaches ``top_p``
    (the token that crosses the threshold is kept), as in Hugging Face's ``TopPLogitsWarper``.
    """
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # Remove a token when the mass before it already reaches top_p.
        remove_sorted = (cum - sorted_logits.softmax(-1)) >= top_p
        remove = remove_sorted.scatter(-1, sorted_idx, remove_sorted)
        logits = logits.masked_fill(remove, float("-inf"))
    return logits


def sample_categorical(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """(B, V) probabilities -> (B,) one draw per row, without a host sync.

    ``argmax(p / E)`` with ``E ~ Exp(1)`` i.i.d. picks token v with probability p_v (the exponential race);
    it is what ``torch.multinomial(probs, 1, generator=g)`` computes, draw for draw, so a seeded run samples
    the same tokens as with ``multinomial`` — without its input checks, which wait for the device.
    """
    race = torch.empty_like(probs).exponential_(1, generator=generator)
    return probs.div_(race).argmax(-1)


class HFRollout(SamplingEngine):
    """Batched sampling from a Hugging Face causal LM (see the module docstring for the algorithm).

    Args:
        model: a causal LM (shared with the trainer; generation runs under ``no_grad`` in eval mode).
        tokenizer: its tokenizer; prompts are encoded with its special tokens (a BOS for the tiny preset).
        max_new_tokens: completion budget per sequence.
        temperature: sampling temperature τ; 0 means greedy (argmax).
        top_p, top_k: nucleus mass (1.0 = off) and top-k (0 = off).
        impl: ``"loop"`` (default, the loop above) or ``"generate"`` (``model.generate``, for models whose
            cache the loop does not handle).
        ignore_eos: generate exactly ``max_new_tokens`` tokens per sequence, EOS included as an ordinary
            token, with every completion position masked in (fixed-length benchmarks).
        record_logprobs: also return ``Rollout.logprobs``, ``log softmax(logits / τ)`` at each sampled token
            (τ = 1 when greedy); one extra (B, V) log-softmax per step (``impl="loop"`` only).
        compile_decode: run each decode step (one token per row) through ``torch.compile``: key/value
            buffers of P + T positions rounded up to a multiple of 64, reused between calls, the attended
            length a dynamic dimension, and no compaction of finished rows (they are computed and discarded
            until all rows finish). The first call of each (batch, buffer length) compiles (tens of seconds
            on CPU). ``impl="loop"`` only.
        cuda_graphs: replay each decode step from a CUDA graph (the gpt-fast approach): static key/value
            buffers as with ``compile_decode``, each step attending over a bucket of 256 positions (later
            positions masked), one graph per bucket captured at its first use and kept for later calls of the
            same shape. Removes the per-layer kernel-launch overhead that bounds an eager decode step on a GPU.
            On a device other than CUDA the same fixed-shape step runs eagerly (no capture). If a model's
            forward cannot be captured, the engine says so once and decodes eagerly. ``impl="loop"`` only, not
            with ``compile_decode``.
        lean_decode: on CPU, run each decode step of a Llama-family model (``LlamaForCausalLM``,
            ``Qwen2ForCausalLM``, float32) through ``lmpo.generation.lean.LeanDecoder``: the same arithmetic as
            the model's forward in a short fixed sequence of ATen calls into preallocated buffers, QKV and
            gate/up projections fused. Its logits equal the model's forward bit for bit on the tested
            configurations, so greedy tokens and seeded samples are the generic loop's; other models (and
            models with forward hooks) say so once and decode through their forward. Ignored on other devices,
            with ``compile_decode`` or ``cuda_graphs``.
        sync_every_tokens: how often the loop reads the finished rows back on the host to stop early and
            compact the batch (default: every token on CPU, where reading costs nothing; every 8 on an
            accelerator). Tokens past a row's EOS are masked whatever this is.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        max_new_tokens: int = 16,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        impl: str = "loop",
        ignore_eos: bool = False,
        record_logprobs: bool = False,
        sync_every_tokens: int | None = None,
        compile_decode: bool = False,
        cuda_graphs: bool = False,
        lean_decode: bool = True,
    ) -> None:
        if impl not in ("loop", "generate"):
            raise ValueError(f"impl={impl!r} must be 'loop' or 'generate'")
        if record_logprobs and impl != "loop":
            raise ValueError("record_logprobs=True needs impl='loop' (model.generate does not return them)")
        if sync_every_tokens is not None and sync_every_tokens < 1:
            raise ValueError(f"sync_every_tokens={sync_every_tokens} must be >= 1")
        super().__init__(model, tokenizer, max_new_tokens, temperature, top_p, top_k, ignore_eos, record_logprobs)
        if compile_decode and impl != "loop":
            raise ValueError("compile_decode=True needs impl='loop'")
        if cuda_graphs and (impl != "loop" or compile_decode):
            raise ValueError(f"cuda_graphs=True needs impl='loop' and compile_decode=False (got impl={impl!r}, "
                             f"compile_decode={compile_decode}); choose one of the two static decode paths")
        self.impl = impl
        self.sync_every_tokens = sync_every_tokens
        self.compile_decode = compile_decode
        self.cuda_graphs = cuda_graphs
        self._compiled: _CompiledDecode | None = None
        self._graphs: _GraphDecode | None = None
        self.lean_decode = lean_decode
        self._lean: LeanDecoder | None = None
        self._lean_refused: nn.Module | None = None  # the model the lean step was refused for (said once)
        #: how the last ``generate`` call decoded: "eager", "lean" (``lean_decode`` on CPU), "compile",
        #: "cuda_graphs" or "static" (the graphs' fixed-shape step run eagerly, off CUDA)
        self.decode_mode = "eager"

    def _compiled_decode(self) -> _CompiledDecode:
        """The compiled decode step of the current model (made at the first call, again after ``sync_weights``
        hands over another model object)."""
        if self._compiled is None or self._compiled.model is not self.model:
            self._compiled = _CompiledDecode(self.model)
        return self._compiled

    def _graph_decode(self, device: torch.device) -> _GraphDecode:
        """The CUDA-graph decode of the current model (new after ``sync_weights`` hands over another model)."""
        if self._graphs is None or self._graphs.model is not self.model:
            self._graphs = _GraphDecode(self.model, capture=device.type == "cuda")
        return self._graphs

    def _lean_decoder(self, device: torch.device) -> LeanDecoder | None:
        """The lean CPU decode step of the current model, its fused weights up to date; None (said once per
        model) when the model cannot take it."""
        if not self.lean_decode or device.type != "cpu" or self.impl != "loop":
            return None
        reason = unsupported(self.model)  # every call: a hook may have been added since the last one
        if reason is not None:
            if self._lean_refused is not self.model:
                warnings.warn(f"lean CPU decode unavailable: {reason}; decoding through the model's forward",
                              RuntimeWarning, stacklevel=4)
                self._lean_refused = self.model
            return None
        if self._lean is None or self._lean.model is not self.model:
            self._lean = LeanDecoder(self.model)
        self._lean.refresh()
        return self._lean

    def sync_weights(self, model: nn.Module) -> None:
        """Nothing to copy: this engine samples from the training model's own parameters."""
        self.model = model

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _next_token(
        self, logits: torch.Tensor, greedy: bool, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, V) last-position logits -> (B,) token ids and, when recording, (B,) their log-probs."""
        if greedy:
            token = logits.argmax(-1)
            scaled = logits.float()
        else:
            scaled = logits.float() / self.temperature
            probs = _filter_top_k_top_p(scaled, self.top_k, self.top_p).softmax(-1)
            token = sample_categorical(probs, generator)
        if not self.record_logprobs:
            return token, None
        return token, scaled.log_softmax(-1).gather(-1, token[:, None]).squeeze(-1)

    @contextlib.contextmanager
    def _eval_mode(self):
        was_training = self.model.training
        config = self.model.config
        attention = config._attn_implementation
        self.model.eval()
        if attention == "sdpa" and self.impl == "loop":
            config._attn_implementation = _DECODE_ATTENTION
        try:
            with torch.no_grad():  # not inference_mode: the ids are reused as inputs of a graph later
                yield
        finally:
            config._attn_implementation = attention
            self.model.train(was_training)

    def generate(
        self,
        prompts: Sequence[str],
        completions_per_prompt: int = 1,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        greedy: bool = False,
    ) -> Rollout:
        """Sample ``completions_per_prompt`` completions for every prompt.

        Randomness comes from ``generator`` if given, else from a new generator seeded with ``seed``, else
        from the global RNG. ``greedy=True`` (or ``temperature == 0``) takes the argmax at every step.
        """
        self.check_request(prompts, completions_per_prompt)
        G = completions_per_prompt
        greedy = greedy or self.temperature == 0
        if generator is None and seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(seed)
        enc = self.tokenizer(list(prompts), padding=True, return_tensors="pt", padding_side="left")
        unique_ids, unique_mask = enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)  # (N, P)
        logprobs = None
        with self._eval_mode():
            if self.impl == "loop":
                state = generator.get_state() if generator is not None else None
                try:
                    completion_ids, finished, logprobs = self._sample_loop(unique_ids, unique_mask, G, greedy,
                                                                           generator)
                except _GraphCaptureFailed:  # redone eagerly, from the same random state
                    if generator is not None:
                        generator.set_state(state)
                    completion_ids, finished, logprobs = self._sample_loop(unique_ids, unique_mask, G, greedy,
                                                                           generator)
            else:
                completion_ids, finished = self._sample_hf_generate(
                    unique_ids.repeat_interleave(G, 0), unique_mask.repeat_interleave(G, 0), greedy, generator)
        mask = completion_mask(completion_ids, self.eos_token_ids, self.ignore_eos)
        completion_ids = completion_ids.masked_fill(mask == 0, self.tokenizer.pad_token_id)
        if logprobs is not None:
            logprobs = logprobs.masked_fill(mask == 0, 0.0)
        texts = self.tokenizer.batch_decode(
            [row[: int(n)] for row, n in zip(completion_ids.tolist(), mask.sum(-1).tolist())],
            skip_special_tokens=True,
        )
        return Rollout(
            prompt_ids=unique_ids.repeat_interleave(G, 0),
            prompt_mask=unique_mask.repeat_interleave(G, 0),
            completion_ids=completion_ids,
            completion_mask=mask,
            group_ids=torch.arange(len(prompts), device=self.device).repeat_interleave(G),
            prompts=[p for p in prompts for _ in range(G)],
            completions=texts,
            truncated=~finished,
            logprobs=logprobs,
        )

    def _sample_loop(self, prompt_ids, prompt_mask, G, greedy, generator):
        """Prefill the N distinct prompts once, then one token per step for the B = N·G rows still running.

        Sampling always draws for all B rows (finished rows draw too and are masked afterwards), so a seeded
        run consumes its generator exactly as the loop that never drops rows, whichever rows finish when.
        """
        model, device = self.model, prompt_ids.device
        N, P = prompt_ids.shape
        B, T = N * G, self.max_new_tokens
        pad = self.tokenizer.pad_token_id
        eos = torch.tensor(self.eos_token_ids, device=device)
        sync_every = self.sync_every_tokens or (1 if device.type == "cpu" else 8)

        compiled = self._compiled_decode() if self.compile_decode else None
        graphs = self._graph_decode(device) if self.cuda_graphs else None
        length = P + T
        if compiled is not None or graphs is not None:
            length = -(-length // _STATIC_LEN_MULTIPLE) * _STATIC_LEN_MULTIPLE
            cache = (compiled or graphs).cache_for(B, length, G, device)
        else:
            cache = _buffer_cache(model, B, length, G)
        lean = self._lean_decoder(device) if compiled is None and graphs is None else None
        self.decode_mode = ("compile" if compiled is not None else "lean" if lean is not None else
                            "eager" if graphs is None else "cuda_graphs" if graphs.capture else "static")
        positions = position_ids_from_mask(prompt_mask)  # (N, P)
        out = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions,
                    past_key_values=cache, use_cache=True, logits_to_keep=1)
        logits = out.logits[:, -1].repeat_interleave(G, 0)  # (B, V): every row's next-token logits
        if graphs is not None:  # the graphs read the mask from their own buffer
            attention = graphs.mask
            attention.zero_()
        else:
            attention = torch.zeros(B, length, dtype=torch.bool, device=device)  # the decode batch's mask
        attention[:, :P] = prompt_mask.bool().repeat_interleave(G, 0)
        next_position = positions[:, -1:].repeat_interleave(G, 0) + 1  # (B, 1)
        rows = torch.arange(B, device=device)  # decode-batch row -> output row
        tokens = torch.full((B, T), pad, dtype=torch.long, device=device)
        token_logp = torch.zeros(B, T, dtype=torch.float32, device=device) if self.record_logprobs else None
        finished = torch.zeros(B, dtype=torch.bool, device=device)
        steps = T
        for t in range(T):
            next_ids, lp = self._next_token(logits, greedy, generator)  # (B,)
            next_ids = next_ids.masked_fill(finished, pad)
            tokens[:, t] = next_ids
            if lp is not None:
                token_logp[:, t] = lp
            if not self.ignore_eos:
                finished = finished | torch.isin(next_ids, eos)
            if t == T - 1:
                break
            if (t + 1) % sync_every == 0 and not self.ignore_eos:  # (no row ever finishes under ignore_eos)
                running = ~finished[rows]  # (B_dec,)
                left = int(running.sum())
                if left == 0:
                    steps = t + 1
                    break
                if (compiled is None and graphs is None
                        and rows.numel() - left >= _COMPACT_FINISHED_FRACTION * rows.numel()):
                    keep = running.nonzero().squeeze(-1)
                    rows, attention, next_position = rows[keep], attention[keep], next_position[keep]
                    cache.batch_select_indices(keep)
            # the sampled token itself is attended to (an EOS too); a finished row's inputs are ignored
            attention[:, P + t] = True
            if graphs is not None:  # fixed shapes: all B rows, the attended bucket under the mask
                try:
                    logits = graphs.step(next_ids, next_position, P + t)
                except RuntimeError as e:  # a forward that cannot be captured: say so once, decode eagerly
                    if not graphs.capture:
                        raise
                    warnings.warn(f"CUDA-graph decode unavailable for {type(model).__name__} ({e}); decoding "
                                  "eagerly from now on", RuntimeWarning, stacklevel=2)
                    self.cuda_graphs = False
                    self._graphs = None
                    raise _GraphCaptureFailed from e
                next_position = next_position + 1
                continue
            if compiled is not None:  # fixed shapes: all B rows, the whole buffer under the mask
                compiled.position.fill_(P + t)
                mask = attention[:, None, None, : P + t + 1]
                torch._dynamo.maybe_mark_dynamic(mask, 3)
                logits = compiled.step(next_ids[:, None], mask, next_position, cache)
                next_position = next_position + 1
                continue
            if lean is not None:
                step_logits = lean.step(next_ids[rows], next_position, P + t, ~attention[:, None, None, : P + t + 1],
                                        [(layer.keys, layer.values) for layer in cache.layers])
                if rows.numel() == B:  # no row dropped: the sampler reads the step's own buffer
                    logits = step_logits
                else:  # (a copy once the step's buffer, an inference tensor, would be written here)
                    logits = logits.clone() if logits.is_inference() else logits
                    logits.index_copy_(0, rows, step_logits)
                next_position = next_position + 1
                continue
            out = model(input_ids=next_ids[rows, None], attention_mask=attention[:, : P + t + 1],
                        position_ids=next_position, past_key_values=cache, use_cache=True)
            logits.index_copy_(0, rows, out.logits[:, -1].to(logits.dtype))
            next_position = next_position + 1
        if token_logp is not None:
            token_logp = token_logp[:, :steps]
        return tokens[:, :steps], finished, token_logp

    def _sample_hf_generate(self, prompt_ids, prompt_mask, greedy, generator):
        if generator is not None:
            # model.generate draws from the global RNG: seed it from the generator, restore it afterwards.
            seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device).item())
            fork = torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else [])
        else:
            seed, fork = None, contextlib.nullcontext()
        with fork:
            if seed is not None:
                torch.manual_seed(seed)
            kwargs = (
                {"do_sample": False}
                if greedy
                else {
                    "do_sample": True,
                    "temperature": self.temperature,
                    "top_p": self.top_p,
                    "top_k": self.top_k if self.top_k > 0 else None,
                }
            )
            out = self.model.generate(
                input_ids=prompt_ids,
                attention_mask=prompt_mask,
                max_new_tokens=self.max_new_tokens,
                min_new_tokens=self.max_new_tokens if self.ignore_eos else None,
                eos_token_id=self.eos_token_ids,
                pad_token_id=self.tokenizer.pad_token_id,
                **kwargs,
            )
        completion_ids = out[:, prompt_ids.shape[1] :]
        if self.ignore_eos:
            return completion_ids, torch.zeros(out.shape[0], dtype=torch.bool, device=out.device)
        finished = torch.isin(completion_ids, torch.tensor(self.eos_token_ids, device=out.device)).any(-1)
        return completion_ids, finished
