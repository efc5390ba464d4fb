"""Argument checks shared by the objective parts.

Every error names the argument, the value it got, the allowed range and how to fix it. Hyper-parameter
checks run once when a frozen config is built; tensor checks run on every call, so they are kept to
shape/dtype comparisons (free) plus one fused finiteness test (a single host sync, which
``Objective(check_finite=False)`` turns off).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from lmpo.config import bounds, check_value


def check_choice(name: str, value: str, allowed: Iterable[str]) -> None:
    """Raise :class:`lmpo.config.ConfigError` unless ``value`` is one of ``allowed`` (names the valid choices)."""
    check_value(value, {"choices": tuple(allowed)}, name, owner="")


def check_range(
    name: str,
    value: float,
    *,
    low: float | None = None,
    high: float | None = None,
    low_inclusive: bool = False,
    high_inclusive: bool = True,
    hint: str = "",
) -> None:
    """Raise :class:`lmpo.config.ConfigError` unless ``value`` is a finite number inside the interval described by the bounds
    (a bound that depends on another argument, which a field's metadata cannot hold)."""
    meta = {**bounds(low, high, low_inclusive=low_inclusive, high_inclusive=high_inclusive), "hint": hint}
    check_value(value, meta, name, tp=float, owner="")


def check_mask_dtype(mask: torch.Tensor, name: str = "mask") -> None:
    if mask.dtype == torch.bool or mask.dtype.is_floating_point:
        return
    if mask.dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
        return
    raise TypeError(
        f"{name} has dtype {mask.dtype}; pass a bool tensor or a float/int tensor holding 0/1 "
        f"(e.g. `{name}.bool()`)."
    )


def check_tensor_shape(name: str, x: torch.Tensor, shape: tuple[int, ...], what: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape {what}, got {type(x).__name__}.")
    if tuple(x.shape) != tuple(shape):
        raise ValueError(
            f"{name} has shape {tuple(x.shape)} but must have shape {what} = {tuple(shape)} "
            f"(the shape of logp); align the padding of all (B,T) inputs."
        )


def report_nonfinite(named: dict[str, torch.Tensor | None], valid: torch.Tensor) -> None:
    """Slow path, run only after the fused check failed: find which input holds NaN/inf at a valid token."""
    for name, x in named.items():
        if x is None:
            continue
        x = x.detach()
        v = valid if x.dim() == 2 else valid.any(-1)
        bad = ~torch.isfinite(x) & v
        if bool(bad.any()):
            first = tuple(int(i) for i in torch.nonzero(bad)[0])
            raise ValueError(
                f"{name} holds a non-finite value ({x[first].item()}) at valid position {first}; "
                f"{int(bad.sum())} valid entries are NaN/inf. Fix the producer of {name}, or mark those "
                f"tokens invalid in mask (masked positions may hold anything)."
            )


def report_bad_mask(mask: torch.Tensor) -> None:
    bad = (mask != 0) & (mask != 1)
    if bool(bad.any()):
        first = tuple(int(i) for i in torch.nonzero(bad)[0])
        raise ValueError(
            f"mask must hold only 0 and 1, got {mask[first].item()} at {first}; pass a bool mask or "
            f"threshold it (e.g. `mask > 0`). Per-token weights belong in the credit weights, not the mask."
        )
