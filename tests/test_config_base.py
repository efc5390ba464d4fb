"""The one config base (lmpo.config): every config file loads, ranges come from field metadata, no cycles."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pytest

from lmpo.config import (
    ConfigError,
    changed_keys,
    check_fields,
    from_dict,
    load,
    option,
    range_text,
    read_yaml,
    to_dict,
)
from lmpo.errors import InputError

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class _Inner:
    """An inner section."""

    rate: float = option(0.5, "A rate.", gt=0, le=1, hint="Use 1 to switch it off.")
    mode: str = option("a", "A mode.", choices=("a", "b"))


@dataclass(frozen=True)
class _Outer:
    """A run."""

    steps: int = option(3, "Steps.", ge=0)
    sizes: tuple[int, ...] = option((1, 2), "Sizes.", ge=1)
    inner: _Inner = option(_Inner(), "Inner section.")


def test_every_file_in_configs_loads_unchanged():
    from lmpo.lab.config import load_lab_config
    from lmpo.textagent.sac.config import load_config as load_sac
    from lmpo.trainer.config import load_config as load_train
    from lmpo.trainer.config import validate_config

    files = sorted((ROOT / "configs").glob("*.yaml"))
    assert len(files) >= 6
    for path in files:
        if path.name.startswith("sac_"):
            cfg = load_sac(path)
            assert cfg.corpus  # the corpus resolves (bundled copy when the path is elsewhere)
        elif path.name.startswith("lab_"):
            load_lab_config(path)  # validated with its cells in tests/lab/test_lab_config.py
        else:
            validate_config(load_train(path))


def test_ranges_choices_and_finiteness_come_from_metadata():
    assert from_dict(_Outer, {"steps": "4", "inner": {"rate": "1e-1"}}) == _Outer(4, (1, 2), _Inner(0.1, "a"))
    with pytest.raises(ConfigError, match=r"`inner.rate` = -0.5 must be in \(0, 1\] \(A rate\)\. Use 1"):
        from_dict(_Outer, {"inner": {"rate": -0.5}})
    with pytest.raises(ConfigError, match=r"`inner.rate` = inf must be a finite number in \(0, 1\]"):
        from_dict(_Outer, {"inner": {"rate": math.inf}})
    with pytest.raises(ConfigError, match=r"`inner.mode` = 'c' is not one of a, b"):
        from_dict(_Outer, {"inner": {"mode": "c"}})
    with pytest.raises(ConfigError, match=r"`sizes\[1\]` = 0 must be >= 1"):
        from_dict(_Outer, {"sizes": [2, 0]})
    with pytest.raises(ConfigError, match=r"unknown config key `inner.rat`\. Did you mean `rate`\?"):
        from_dict(_Outer, {"inner": {"rat": 1}})
    with pytest.raises(ConfigError, match=r"`steps` = 'abc' must be an integer"):
        from_dict(_Outer, {"steps": "abc"})
    # a config built in code is checked by check_fields, with the same messages
    with pytest.raises(ConfigError, match=r"`steps` = -1 must be >= 0"):
        check_fields(_Outer(steps=-1))
    assert issubclass(ConfigError, InputError) and issubclass(ConfigError, ValueError)
    assert range_text({"ge": 0}) == ">= 0" and range_text({"gt": 0, "lt": 1}) == "in (0, 1)"


def test_yaml_overrides_roundtrip_and_diff(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("steps: 5\ninner:\n  mode: b\n")
    cfg = load(_Outer, f, ["--inner.rate", "0.25"], base={"sizes": [3]})
    assert cfg == _Outer(5, (3,), _Inner(0.25, "b"))
    assert from_dict(_Outer, to_dict(cfg)) == cfg
    assert changed_keys(to_dict(_Outer()), to_dict(cfg)) == [
        ("inner.mode", "a", "b"), ("inner.rate", 0.5, 0.25), ("sizes", [1, 2], [3]), ("steps", 3, 5)]


@pytest.mark.parametrize("text, expected", [
    ("steps: [1\n", r"is not valid YAML at line 2, column 1"),
    ("- 1\n- 2\n", r"must hold a YAML mapping of keys to values, not a list"),
    ("x: !!python/object/apply:os.system ['true']\n", r"is not valid YAML at line 1, column 4"),
])
def test_malformed_yaml_is_one_message(tmp_path, text, expected):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=expected):
        read_yaml(f)


def test_config_sections_raise_the_base_error():
    """rlvcr/config.py builds on lmpo.config (tests/docs/test_import_graph.py checks that importing it and
    lmpo.textagent.sac.config loads nothing of the trainer)."""
    from lmpo.rlvcr.config import RLVCRConfig

    with pytest.raises(ConfigError) as raised:
        RLVCRConfig(levels=1)
    assert type(raised.value).__module__ == "lmpo.config"


def test_sac_default_corpus_is_bundled_and_no_absolute_paths_in_src():
    from lmpo.textagent.env.bundled import resolve_corpus
    from lmpo.textagent.sac.config import TrainConfig

    path = resolve_corpus(TrainConfig().corpus)
    assert path.is_file() and path.stat().st_size > 50_000
    assert (path.parent / "LICENSE.chinese-poetry").is_file()
    offenders = []
    for p in (ROOT / "src").rglob("*.py"):
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            if "/work/" in line or "/home/" in line:
                offenders.append(f"{p.relative_to(ROOT)}:{n}")
    assert not offenders


def test_sac_and_env_config_reference_is_documented_and_current():
    import dataclasses

    from lmpo.config import generated_block
    from lmpo.textagent.env import EnvConfig
    from lmpo.textagent.sac.config import TrainConfig, render_config_reference

    def undocumented(cls):
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(f.default):
                yield from undocumented(type(f.default))
            elif not f.metadata.get("help"):
                yield f"{cls.__name__}.{f.name}"

    assert not list(undocumented(TrainConfig)) and not list(undocumented(EnvConfig))
    doc = (ROOT / "docs" / "sac.md").read_text(encoding="utf-8")
    assert generated_block(doc, "sac-config-reference") == render_config_reference(), \
        "docs/sac.md is stale: run `make docs`"


@dataclass(frozen=True)
class _Part:
    """A section."""

    size: int = option(2, "Size.", ge=1)
    free: dict = option({}, "Free-form.")


def test_flat_aliases_table_is_checked_when_the_class_is_defined():
    from lmpo.config import flat_aliases

    for table in ({"size": "part.nope"}, {"part": "part.size"}, {"a": "part.size", "b": "part.size"},
                  {"a": "size"}):
        with pytest.raises(TypeError):
            @flat_aliases(table)
            @dataclass(frozen=True)
            class _Bad:
                part: _Part = option(_Part(), "Part.")


def test_merge_layers_lets_the_later_layer_win_and_is_deep_merge_without_aliases():
    from lmpo.config import deep_merge, flat_aliases, merge_layers

    @flat_aliases({"part_size": "part.size"})
    @dataclass(frozen=True)
    class _Cfg:
        """A config with a flat name."""

        part: _Part = option(_Part(), "Part.")

    assert merge_layers(_Cfg, {"part_size": 3}, {"part": {"size": 4}}) == {"part": {"size": 4}}
    assert merge_layers(_Cfg, {"part": {"size": 4, "free": {"a": 1}}}, {"part_size": 5, "part": {"free": {"b": 2}}}) \
        == {"part": {"free": {"a": 1, "b": 2}}, "part_size": 5}
    assert from_dict(_Cfg, {"part_size": 3}).part.size == 3 and _Cfg(part_size=3).part_size == 3
    base, over = {"inner": {"x": 1, "d": {"a": 1}}}, {"inner": {"d": {"b": 2}}}
    assert merge_layers(_Outer, base, over) == deep_merge(base, over)
