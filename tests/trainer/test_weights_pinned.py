"""The trainer's weights and metrics after 3 off-policy RL steps, pinned for every preset and the loop's optional
paths (KL in the loss and in the reward, reference sync, ReMax, dynamic sampling, truncation masking,
zero-variance filtering, sampler log-probs on- and off-policy, two epochs, on-policy).

Float rounding depends on the CPU model, its kernel dispatch level (``ATEN_CPU_CAPABILITY``), the BLAS/oneDNN
build and the thread count, so each case is pinned twice:

- **bit for bit** (sha256 of the weights and of the metric rows) for each machine that recorded pins, keyed by
  its full :func:`fingerprint`; compared only where the running machine's fingerprint is identical;
- **within a measured tolerance** everywhere: a summary that survives rounding (:func:`summarize`: fixed ±1
  projections, in float64, of the change training made to the weights, and the metric rows) must lie within
  the case's tolerance of the recorded one (:func:`distance`: the weights relative to the size of their change,
  each metric on its own). A tolerance is ``FACTOR`` times the largest distance measured between runs of the
  case under every dispatch level at or below the recording machine's own and 1 or 2 threads, with a floor
  (:func:`tolerance_from`); the data file keeps the measured spreads, the tolerances, how they were measured and
  on which machine. ``test_a_deliberate_change_falls_outside_the_tolerance`` shows that changes of meaning far
  smaller than any real edit (clip ε 0.2 -> 0.2001, lr x 1.001, one more optimizer step) fall outside it, and
  ``test_pins_hold_under_a_second_dispatch_level`` runs every case again one dispatch level down.

Commands (run them on a commit whose values you trust)::

    PYTHONPATH=src python tests/trainer/test_weights_pinned.py --record           # this machine's bit-exact pins
                                                                                   # and the reference summaries
    PYTHONPATH=src python tests/trainer/test_weights_pinned.py --measure-spread   # re-measure the tolerances
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from trainer_helpers import make_trainer

from lmpo.objectives import PRESETS

PINS = Path(__file__).parent / "data" / "weights_after_3_steps.json"
RECORD = "PYTHONPATH=src python tests/trainer/test_weights_pinned.py --record"
MEASURE = "PYTHONPATH=src python tests/trainer/test_weights_pinned.py --measure-spread"

VARIANTS = {
    "kl_in_reward": ("grpo", {"objective": {"kl_in_reward": True}}),
    "remax": ("grpo", {"objective": {"advantage_estimator": "remax"}}),
    "dyn_sampling": ("grpo", {"rollout": {"dynamic_sampling": True}}),
    "mask_trunc": ("grpo", {"objective": {"mask_truncated_completions": True}}),
    "filter_zero": ("grpo", {"objective": {"filter_zero_variance": True}}),
    "kl_loss": ("grpo", {"objective": {"overrides": {"kl_coef": 0.05}}}),
    "kl_loss_and_reward": ("grpo", {"objective": {"kl_in_reward": True, "overrides": {"kl_coef": 0.05}}}),
    "ref_sync": ("grpo", {"objective": {"overrides": {"kl_coef": 0.05}, "ref_sync_steps": 1}}),
    "record_logp_off": ("grpo", {"rollout": {"record_logprobs": True}}),
    "record_logp_on": ("grpo", {"rollout": {"record_logprobs": True}, "loop": {"minibatches_per_step": 1}}),
    "epochs2": ("grpo", {"loop": {"epochs_per_step": 2}}),
    "on_policy": ("grpo", {"loop": {"minibatches_per_step": 1}}),
}
CASES = sorted(PRESETS) + sorted(VARIANTS)

# the rounding-robust summary: PROJECTIONS fixed ±1 directions drawn from SEED (integers, so the directions are
# the same on every machine); a tolerance is FACTOR x the largest measured spread, never below a floor: a
# relative WEIGHTS_FLOOR for the weights, METRIC_FLOOR_REL x |value| + METRIC_FLOOR_ABS for a metric
PROJECTIONS = 8
SEED = 20260
FACTOR = 10.0
WEIGHTS_FLOOR = 1e-6
METRIC_FLOOR_REL, METRIC_FLOOR_ABS = 1e-6, 1e-9
LEVELS = ("default", "avx2", "avx512")  # ATEN_CPU_CAPABILITY values, lowest first
THREADS = (1, 2)


def _cpu() -> dict:
    """What decides the CPU's float rounding beyond the dispatch level: vendor, model and its SIMD extensions."""
    info = {"vendor_id": "", "model name": platform.processor(), "cpu family": "", "model": "", "stepping": ""}
    simd = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = (part.strip() for part in line.partition(":"))
                if key in info and not info[key]:
                    info[key] = value
                elif key == "flags" and not simd:
                    simd = {flag for flag in value.split() if flag.startswith(("avx", "fma", "amx", "f16c"))}
    except OSError:  # not Linux: the platform's processor string is all there is
        pass
    cpu = f"{info['vendor_id']} {info['model name']}".strip()
    if info["cpu family"]:
        cpu += f", family {info['cpu family']} model {info['model']} stepping {info['stepping']}"
    return {"cpu": cpu, "simd": " ".join(sorted(simd))}


def _blas() -> str:
    """The MKL and oneDNN builds torch reports, and whether oneDNN is on."""
    shown = torch.__config__.show().splitlines()
    lines = [line.strip(" -") for line in shown if "Math Kernel Library" in line or "MKL-DNN" in line
             or "oneDNN" in line]
    return "; ".join(lines + [f"mkldnn enabled={torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled}"])


def fingerprint() -> dict:
    """The running machine as far as float rounding goes (the key of the bit-exact pins)."""
    return {"torch": torch.__version__, "arch": platform.machine(),
            "capability": torch.backends.cpu.get_cpu_capability(), **_cpu(), "blas": _blas(),
            "threads": torch.get_num_threads()}


def case_sections(name: str, change: dict | None = None) -> tuple[str, dict]:
    """(preset, config sections) of a case: 3 RL steps of 2 minibatches, plus ``change`` (section -> fields)."""
    preset, sections = (name, {}) if name in PRESETS else VARIANTS[name]
    sections = {**sections, "loop": {"steps": 3, "minibatches_per_step": 2, **sections.get("loop", {})}}
    for section, fields in (change or {}).items():
        merged = {**sections.get(section, {}), **fields}
        if "overrides" in fields:
            merged["overrides"] = {**sections.get(section, {}).get("overrides", {}), **fields["overrides"]}
        sections[section] = merged
    return preset, sections


def _flat(model) -> np.ndarray:
    return np.concatenate([value.detach().cpu().double().reshape(-1).numpy()
                           for _, value in sorted(model.state_dict().items())])


def _directions(n: int) -> np.ndarray:
    """(PROJECTIONS, n) ±1 directions, the same on every machine for the same n."""
    bits = np.random.default_rng(SEED).integers(0, 2, size=(PROJECTIONS, n), dtype=np.int8)
    return (2.0 * bits - 1.0) / math.sqrt(n)


def summarize(initial: np.ndarray, final: np.ndarray, rows: list[dict]) -> dict:
    """The rounding-robust summary of a run.

    - ``weights``: [rms(Δ), <r_1, Δ>, …, <r_K, Δ>] with Δ = final − initial weights (float64) and r_k the fixed
      ±1/√n directions: the change training made (n ≈ 13,500 numbers in K + 1), so a change of the training
      shows at full size, not diluted by the initial weights;
    - ``metrics``: the numeric metric rows themselves (about 100 numbers): a projection would dilute a change in
      one metric (a loss value) by √100.
    """
    delta = final - initial
    return {"weights": [float(np.sqrt(np.mean(delta ** 2)))] + _directions(delta.size).dot(delta).tolist(),
            "metrics": [{k: float(v) for k, v in sorted(row.items()) if isinstance(v, (bool, int, float))}
                        for row in rows]}


def _gap(a: float, b: float) -> float:
    if math.isfinite(a) and math.isfinite(b):
        return abs(a - b)
    return 0.0 if (math.isnan(a) and math.isnan(b)) or a == b else math.inf


LAYOUT = "(rows and keys)"  # the pseudo-metric that differs when the rows or their keys do


def distance(run: dict, pinned: dict) -> dict:
    """How far a run's summary lies from the pinned one.

    ``weights``: max_k |s_k − p_k| / rms(Δ_pinned), relative to the change training made; ``metrics``: for each
    metric key, the largest |m − m_pinned| over the rows (inf where one value is finite and the other not, and
    under ``LAYOUT`` when the rows or their keys differ).
    """
    w, p = np.asarray(run["weights"]), np.asarray(pinned["weights"])
    weights = float(np.max(np.abs(w - p)) / max(p[0], 1e-30))
    rows, pinned_rows = run["metrics"], pinned["metrics"]
    if [sorted(r) for r in rows] != [sorted(r) for r in pinned_rows]:
        return {"weights": weights, "metrics": {LAYOUT: math.inf}}
    metrics: dict[str, float] = {}
    for row, ref in zip(rows, pinned_rows):
        for key in row:
            metrics[key] = max(metrics.get(key, 0.0), _gap(row[key], ref[key]))
    return {"weights": weights, "metrics": metrics}


def tolerance_from(spread: dict, summary: dict) -> dict:
    """FACTOR x the measured spread, never below the floors (a metric's relative to its largest |value|)."""
    largest = {}
    for row in summary["metrics"]:
        for key, value in row.items():
            largest[key] = max(largest.get(key, 0.0), abs(value) if math.isfinite(value) else 0.0)
    return {"weights": max(FACTOR * spread["weights"], WEIGHTS_FLOOR),
            "metrics": {key: max(FACTOR * spread["metrics"].get(key, 0.0),
                                 METRIC_FLOOR_REL * largest[key] + METRIC_FLOOR_ABS) for key in largest}}


def run_case(name: str, run_dir, change: dict | None = None, after_training=None) -> dict:
    """``exact``: [sha256 of the weights, sha256 of the metrics without timings]; ``summary``: :func:`summarize`.
    ``after_training(trainer)`` runs between the training and the readings (a deliberate change)."""
    preset, sections = case_sections(name, change)
    trainer = make_trainer(run_dir, preset, **sections)
    initial = _flat(trainer.model)
    history = trainer.train().history
    if after_training is not None:
        after_training(trainer)
    weights = hashlib.sha256()
    for key, value in sorted(trainer.model.state_dict().items()):
        weights.update(key.encode())
        weights.update(value.detach().cpu().contiguous().numpy().tobytes())
    rows = [{k: v for k, v in row.items() if not k.startswith(("time/", "perf/"))} for row in history]
    metrics = hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()
    return {"exact": [weights.hexdigest(), metrics], "summary": summarize(initial, _flat(trainer.model), rows)}


def _pins() -> dict:
    return json.loads(PINS.read_text()) if PINS.is_file() else {"exact": [], "cases": {}}


def exact_pins_here(pins: dict) -> dict | None:
    """The bit-exact pins recorded on a machine identical to this one, if any."""
    here = fingerprint()
    return next((entry["cases"] for entry in pins["exact"] if entry["fingerprint"] == here), None)


def outside_tolerance(name: str, summary: dict, pins: dict) -> list[str]:
    """What of ``summary`` lies farther from the pinned summary than the case's tolerance, described."""
    case = pins["cases"][name]
    far, tol, spread = distance(summary, case["summary"]), case["tolerance"], case["spread"]
    out = []
    if not far["weights"] <= tol["weights"]:
        out.append(f"weights: distance {far['weights']:.3g} > tolerance {tol['weights']:.3g} (measured spread "
                   f"{spread['weights']:.3g})")
    for key, gap in far["metrics"].items():
        if not gap <= tol["metrics"].get(key, -1.0):
            out.append(f"metric {key}: off by {gap:.3g} > tolerance {tol['metrics'].get(key, 0.0):.3g} (measured "
                       f"spread {spread['metrics'].get(key, 0.0):.3g})")
    return out


def times_tolerance(name: str, summary: dict, pins: dict) -> dict:
    """{"weights": distance / tolerance, "metrics": the largest metric distance / its tolerance} (> 1: caught)."""
    case = pins["cases"][name]
    far, tol = distance(summary, case["summary"]), case["tolerance"]
    return {"weights": far["weights"] / tol["weights"],
            "metrics": max((gap / tol["metrics"][key] if key in tol["metrics"] else math.inf)
                           for key, gap in far["metrics"].items())}


def _changed(name: str, what: str) -> str:
    return (f"{name}: the weights or metrics after 3 off-policy steps changed ({what}); a change that is meant "
            f"to keep values must keep them (if the values are meant to change: {RECORD}, then {MEASURE})")


@pytest.mark.parametrize("name", CASES)
def test_weights_and_metrics_after_3_off_policy_steps_are_pinned(tmp_path, name):
    pins = _pins()
    assert name in pins["cases"], f"a new preset or case: record its pins with {RECORD}, then {MEASURE}"
    run = run_case(name, tmp_path / "run")
    far = outside_tolerance(name, run["summary"], pins)
    assert not far, _changed(name, "; ".join(far))
    exact = exact_pins_here(pins)
    if exact is not None:  # the machine that recorded them: not one bit may move
        assert run["exact"] == exact[name], _changed(name, "bit for bit, on the machine that recorded the pins")


def _summaries_in_subprocess(capability: str, threads: int, cases: list[str], out: Path,
                             change: dict | None = None, timeout: float | None = 600) -> dict:
    """Every case's summary from a fresh interpreter whose kernels dispatch at ``capability`` (the variable is
    read once, when torch loads). Idle OpenMP threads sleep instead of spinning (``OMP_WAIT_POLICY``: the
    same results, and 2 threads on a busy 2-core machine no longer take minutes)."""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability, "OMP_WAIT_POLICY": "PASSIVE",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2] / "src"), os.environ.get("PYTHONPATH", "")])}
    args = [sys.executable, __file__, "--summaries", str(out), "--threads", str(threads),
            "--change", json.dumps(change or {}), *cases]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def _levels_here() -> list[str]:
    """The dispatch levels this CPU runs, lowest first (torch falls back to the native level for higher ones)."""
    native = torch.backends.cpu.get_cpu_capability().lower()
    return list(LEVELS[:LEVELS.index(native) + 1]) if native in LEVELS else [native]


@pytest.mark.slow
def test_pins_hold_under_a_second_dispatch_level(tmp_path):
    """Every case run with the kernels one dispatch level below this CPU's own (avx512 -> avx2, avx2 -> default)
    stays within its tolerance: a pin that holds on one CPU only fails here, on any machine."""
    levels = _levels_here()
    if len(levels) < 2:
        pytest.skip(f"this CPU dispatches only at {levels[0]!r}: there is no second level to run the pins under")
    pins = _pins()
    summaries = _summaries_in_subprocess(levels[-2], 1, CASES, tmp_path / "summaries.json")
    far = {name: outside_tolerance(name, summaries[name], pins) for name in CASES}
    assert not any(far.values()), f"under ATEN_CPU_CAPABILITY={levels[-2]}: " + "; ".join(
        f"{name}: {', '.join(why)}" for name, why in far.items() if why)


def _one_more_optimizer_step(trainer) -> None:
    """An optimizer step after the last one, on a zero gradient: AdamW's moment estimates alone move the weights
    (what an off-by-one in the loop would add); the metric rows stay as they were."""
    for param in trainer.model.parameters():
        param.grad = torch.zeros_like(param)
    trainer.optimizer.step()


#: changes of meaning far below any real edit: (case, config change, what is done after training, the part of
#: the summary that must catch it)
DELIBERATE = {
    # no token's ratio lies between 1.2 and 1.2001, so the weights stay bit for bit; the loss value moves
    "clip eps 0.2 -> 0.2001": ("grpo", {"objective": {"overrides": {"eps_low": 0.2001}}}, None, "metrics"),
    "lr x 1.001": ("grpo", {"optim": {"lr": 1.001e-2}}, None, "weights"),
    "one more optimizer step": ("grpo", None, _one_more_optimizer_step, "weights"),
}


@pytest.mark.parametrize("change", sorted(DELIBERATE))
def test_a_deliberate_change_falls_outside_the_tolerance(tmp_path, change):
    """The tolerance is not so loose that it passes a real change: each change here moves the part of the summary
    it acts on farther than the case's tolerance (the failure message says how far, in tolerances)."""
    name, sections, after, part = DELIBERATE[change]
    run = run_case(name, tmp_path / "run", sections, after)
    times = times_tolerance(name, run["summary"], _pins())
    assert times[part] > 1, (f"{change} on {name}: the {part} moved {times[part]:.3g} x the tolerance, which is "
                             f"too loose to catch a real change (distance / tolerance: {times})")


def _record() -> None:
    """This machine's bit-exact pins (replacing any from an identical machine) and the reference summaries."""
    import tempfile

    torch.set_num_threads(1)  # as the trainer tests run (tests/trainer/conftest.py)
    pins = _pins()
    with tempfile.TemporaryDirectory() as tmp:
        runs = {name: run_case(name, Path(tmp) / name) for name in CASES}
    here = fingerprint()
    pins["exact"] = [e for e in pins["exact"] if e["fingerprint"] != here] + [
        {"fingerprint": here, "cases": {name: run["exact"] for name, run in runs.items()}}]
    old = pins["cases"]
    unmeasured = {"weights": 0.0, "metrics": {}}
    pins["cases"] = {}
    for name, run in runs.items():
        spread = old.get(name, {}).get("spread", unmeasured)
        pins["cases"][name] = {"summary": run["summary"], "spread": spread,
                               "tolerance": tolerance_from(spread, run["summary"])}
    pins["summary_recorded_on"] = here
    _write(pins)
    print(f"{PINS}: {len(runs)} cases pinned bit for bit on {here}; the reference summaries replaced (re-measure "
          f"the tolerances with: {MEASURE})")


def _measure_spread(keep: Path | None) -> None:
    """Run every case under every dispatch level this CPU has and 1 and 2 threads (one subprocess each; their
    summaries are kept in ``keep`` when given, and read from there when already written); the spread of a case
    is the largest distance between any two of these runs and the recorded summary."""
    import itertools
    import tempfile

    pins = _pins()
    configs = [(level, threads) for level in _levels_here() for threads in THREADS]
    with tempfile.TemporaryDirectory() as tmp:
        folder = keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        runs = {}
        for level, threads in configs:
            out = folder / f"{level}_{threads}_threads.json"
            runs[f"{level}/{threads} thread(s)"] = json.loads(out.read_text()) if out.is_file() else \
                _summaries_in_subprocess(level, threads, CASES, out, timeout=None)
    print(f"{'case':20s} {'weights spread':>14s} {'tolerance':>10s}   metrics: largest spread / |value|")
    for name in CASES:
        summaries = [pins["cases"][name]["summary"]] + [run[name] for run in runs.values()]
        weights, metrics = 0.0, {}
        for a, b in itertools.permutations(summaries, 2):
            far = distance(a, b)
            weights = max(weights, far["weights"])
            for key, gap in far["metrics"].items():
                metrics[key] = max(metrics.get(key, 0.0), gap)
        spread = {"weights": weights, "metrics": metrics}
        case = pins["cases"][name]
        case.update(spread=spread, tolerance=tolerance_from(spread, case["summary"]))
        largest = {key: max(abs(row.get(key, 0.0)) for row in case["summary"]["metrics"]) for key in metrics}
        relative = {key: gap / largest[key] if largest[key] else math.inf for key, gap in metrics.items() if gap > 0}
        worst = max(relative, key=relative.get, default=None)
        print(f"{name:20s} {weights:14.3g} {case['tolerance']['weights']:10.3g}   "
              + (f"{relative[worst]:.3g} ({worst}); {len(relative)} of {len(metrics)} metrics differ" if worst else
                 "no metric differs"))
    pins["spread_measured"] = {
        "how": (f"every case run under ATEN_CPU_CAPABILITY x torch threads = {list(runs)} (one subprocess each); "
                "spread = the largest distance between any two of these runs and the recorded summary (weights: "
                "relative to rms of the weight change; metrics: per key, absolute, over the rows); tolerance = "
                f"max({FACTOR:g} x spread, floor): floor {WEIGHTS_FLOOR:g} for the weights, {METRIC_FLOOR_REL:g} x "
                f"|value| + {METRIC_FLOOR_ABS:g} for a metric; command: {MEASURE}"),
        "on": fingerprint() | {"threads": list(THREADS)}}
    _write(pins)


def _write(pins: dict) -> None:
    order = ["about", "summary_recorded_on", "spread_measured", "exact", "cases"]
    pins["about"] = (f"written by tests/trainer/test_weights_pinned.py ({RECORD}; {MEASURE}); see its docstring")
    PINS.write_text(json.dumps({key: pins[key] for key in order if key in pins}, indent=1) + "\n")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", action="store_true", help="record this machine's pins and the summaries")
    parser.add_argument("--measure-spread", action="store_true", help="re-measure every case's tolerance")
    parser.add_argument("--keep", type=Path, help="with --measure-spread: keep (and reuse) each configuration's "
                        "summaries in this directory")
    parser.add_argument("--summaries", type=Path, help="write the summaries of CASES to this JSON file")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--change", default="{}", help="config sections merged into every case (JSON)")
    parser.add_argument("cases", nargs="*")
    args = parser.parse_args()
    if args.record:
        _record()
    elif args.measure_spread:
        _measure_spread(args.keep)
    elif args.summaries:
        import tempfile

        torch.set_num_threads(args.threads)
        with tempfile.TemporaryDirectory() as tmp:
            out = {name: run_case(name, Path(tmp) / name, json.loads(args.change))["summary"]
                   for name in args.cases or CASES}
        args.summaries.write_text(json.dumps(out))
    else:
        parser.error("give --record, --measure-spread or --summaries FILE")
