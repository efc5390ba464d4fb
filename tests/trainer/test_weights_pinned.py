"""The trainer's weights and metrics after 3 off-policy RL steps, pinned for every preset and the loop's optional
paths (KL in the loss and in the reward, reference sync, ReMax, dynamic sampling, truncation masking,
zero-variance filtering, sampler log-probs on- and off-policy, two epochs, on-policy).

Float rounding depends on the CPU model, its kernel dispatch level (``ATEN_CPU_CAPABILITY``), the BLAS/oneDNN
build and the thread count, so each case is pinned twice:

- **bit for bit** (sha256 of the weights and of the metric rows) for each machine that recorded pins, keyed by
  its full :func:`fingerprint`; compared only where the running machine's fingerprint is identical;
- **within a measured tolerance** everywhere: a summary that survives rounding (:func:`summarize`: fixed ±1
  projections, in float64, of the change training made to the weights, and the metric rows) must lie within
  the case's tolerance of the recorded one (:func:`distance`). The tolerance is ``FACTOR`` times the largest distance measured between runs of the case
  under every dispatch level at or below the machine's own and 1 or 2 threads (with a floor); the data file
  keeps the measured spread, the configurations and the machine. ``test_a_deliberate_change_falls_outside``
  shows that changes of meaning far smaller than any real edit (clip ε 0.2 -> 0.2001, lr x 1.001, one more
  optimizer step) fall outside it.

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
# the same on every machine); the tolerance is FACTOR x the largest measured spread, never below FLOOR
PROJECTIONS = 8
SEED = 20260
FACTOR = 10.0
FLOOR = {"weights": 1e-6, "metrics": 1e-6}
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


def _metric_distance(a: float, b: float) -> float:
    if math.isfinite(a) and math.isfinite(b):
        return abs(math.asinh(a) - math.asinh(b))
    return 0.0 if (math.isnan(a) and math.isnan(b)) or a == b else math.inf


def distance(run: dict, pinned: dict) -> dict:
    """How far a run's summary lies from the pinned one.

    ``weights``: max_k |s_k − p_k| / rms(Δ_pinned), relative to the change training made; ``metrics``:
    max over every row and key of |asinh(m) − asinh(m_pinned)| (relative for large values, absolute near 0, so
    a count and a small loss weigh alike); inf when the rows, their keys or which values are finite differ.
    """
    w, p = np.asarray(run["weights"]), np.asarray(pinned["weights"])
    weights = float(np.max(np.abs(w - p)) / max(p[0], 1e-30))
    rows, pinned_rows = run["metrics"], pinned["metrics"]
    if [sorted(r) for r in rows] != [sorted(r) for r in pinned_rows]:
        return {"weights": weights, "metrics": math.inf}
    metrics = max((_metric_distance(row[k], ref[k]) for row, ref in zip(rows, pinned_rows) for k in row),
                  default=0.0)
    return {"weights": weights, "metrics": metrics}


def run_case(name: str, run_dir, change: dict | None = None) -> dict:
    """``exact``: [sha256 of the weights, sha256 of the metrics without timings]; ``summary``: :func:`summarize`."""
    preset, sections = case_sections(name, change)
    trainer = make_trainer(run_dir, preset, **sections)
    initial = _flat(trainer.model)
    history = trainer.train().history
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
    """The parts of ``summary`` farther from the pinned summary than the case's tolerance, described."""
    case = pins["cases"][name]
    far = distance(summary, case["summary"])
    return [f"{part} distance {far[part]:.3g} > tolerance {case['tolerance'][part]:.3g} (measured spread "
            f"{case['spread'][part]:.3g})" for part in far if not far[part] <= case["tolerance"][part]]


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


DELIBERATE = {  # changes of meaning far below any real edit, each on a case where it acts
    "clip eps 0.2 -> 0.2001": ("cispo", {"objective": {"overrides": {"eps_high": 0.2001}}}),
    "lr x 1.001": ("grpo", {"optim": {"lr": 1.001e-2}}),
    "one more optimizer step": ("grpo", {"loop": {"epochs_per_step": 2, "minibatches_per_step": 1}}),
}


@pytest.mark.parametrize("change", sorted(DELIBERATE))
def test_a_deliberate_change_falls_outside_the_tolerance(tmp_path, change):
    """The tolerance is not so loose that it passes a real change: each change here moves the summary farther
    than the case's tolerance (the failure message says by how much)."""
    name, sections = DELIBERATE[change]
    pins = _pins()
    run = run_case(name, tmp_path / "run", sections)
    assert outside_tolerance(name, run["summary"], pins), (
        f"{change} on {name}: every distance is within the tolerance, which is too loose to catch a real change "
        f"(distances {distance(run['summary'], pins['cases'][name]['summary'])}, tolerance "
        f"{pins['cases'][name]['tolerance']})")


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
    pins["cases"] = {name: {"summary": run["summary"],
                            "spread": old.get(name, {}).get("spread", {"weights": math.nan, "metrics": math.nan}),
                            "tolerance": old.get(name, {}).get("tolerance", FLOOR)} for name, run in runs.items()}
    pins["summary_recorded_on"] = here
    _write(pins)
    print(f"{PINS}: {len(runs)} cases pinned bit for bit on {here}; the reference summaries replaced (re-measure "
          f"the tolerances with: {MEASURE})")


def _measure_spread() -> None:
    """Run every case under every dispatch level this CPU has and 1 and 2 threads (one subprocess each); the
    spread of a case is the largest distance between any two of these runs and the recorded summary."""
    import itertools
    import tempfile

    pins = _pins()
    configs = [(level, threads) for level in _levels_here() for threads in THREADS]
    with tempfile.TemporaryDirectory() as tmp:
        runs = {f"{level}/{threads} thread(s)": _summaries_in_subprocess(level, threads, CASES,
                                                                          Path(tmp) / f"{level}{threads}.json",
                                                                          timeout=None)
                for level, threads in configs}
    print(f"{'case':20s} {'weights spread':>15s} {'tolerance':>10s} {'metrics spread':>15s} {'tolerance':>10s}")
    for name in CASES:
        summaries = [pins["cases"][name]["summary"]] + [run[name] for run in runs.values()]
        spread = {part: max(distance(a, b)[part] for a, b in itertools.permutations(summaries, 2))
                  for part in FLOOR}
        tolerance = {part: max(FACTOR * spread[part], FLOOR[part]) for part in FLOOR}
        pins["cases"][name].update(spread=spread, tolerance=tolerance)
        print(f"{name:20s} {spread['weights']:15.3g} {tolerance['weights']:10.3g} {spread['metrics']:15.3g} "
              f"{tolerance['metrics']:10.3g}")
    pins["spread_measured"] = {
        "how": (f"every case run under ATEN_CPU_CAPABILITY x torch threads = {list(runs)} (one subprocess each); "
                "spread = the largest distance between any two of these runs and the recorded summary; tolerance "
                f"= max({FACTOR:g} x spread, floor {FLOOR}); command: {MEASURE}"),
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
    parser.add_argument("--summaries", type=Path, help="write the summaries of CASES to this JSON file")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--change", default="{}", help="config sections merged into every case (JSON)")
    parser.add_argument("cases", nargs="*")
    args = parser.parse_args()
    if args.record:
        _record()
    elif args.measure_spread:
        _measure_spread()
    elif args.summaries:
        import tempfile

        torch.set_num_threads(args.threads)
        with tempfile.TemporaryDirectory() as tmp:
            out = {name: run_case(name, Path(tmp) / name, json.loads(args.change))["summary"]
                   for name in args.cases or CASES}
        args.summaries.write_text(json.dumps(out))
    else:
        parser.error("give --record, --measure-spread or --summaries FILE")
