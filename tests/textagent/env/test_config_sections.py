"""EnvConfig's sections and the flat names of the one-level config it replaced (lmpo.textagent.env.config.FLAT_NAMES)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from lmpo.config import ConfigError, fields_of, from_dict, load, to_dict
from lmpo.textagent.env import CharTextEnv, EnvConfig
from lmpo.textagent.env.config import FLAT_NAMES, InfoNCEConfig
from lmpo.textagent.env.infonce import InfoNCEConfig as EncoderConfig

ROOT = Path(__file__).resolve().parents[3]

#: every field of the one-level EnvConfig (47), with its default there
OLD_DEFAULTS = {
    "window_chars": 32, "max_steps": 64, "start": "random", "illegal_done": True, "split": "train",
    "heldout_fraction": 0.2, "split_seed": 0, "min_count": 1, "separator": None, "max_run_chars": 3, "blacklist": (),
    "blacklist_path": None, "whitelist_size": 64, "use_coverage": True, "use_infonce": True,
    "use_bigram_bonus": True, "use_garble": True, "use_illegal_penalty": True, "use_normalisation": True,
    "ngram_n": 3, "coverage_window_chars": 64, "lambda_cov": 1.0, "lambda_nce": 0.5, "lambda_gar": 0.1,
    "lambda_ill": 2.0, "lambda_bigram": 1.0, "bigram_match_bonus": 0.5, "lambda_target": 0.0, "garble_min_count": 2,
    "norm_beta": 1e-3, "norm_eps": 1e-8, "norm_warmup": True, "potential_coef": 0.0, "potential_gamma": 0.995,
    "nce_context_chars": 8, "nce_hidden_dim": 64, "nce_embed_dim": 32, "nce_tau": 0.07, "nce_momentum": 0.99,
    "nce_queue_size": 64, "nce_lr": 3e-3, "nce_pairs_per_step": 128, "nce_pretrain_steps": 300, "nce_seed": 0,
    "use_jieba_lexicon": True, "augment_lexicon_with_reference": True, "lexicon_dir": None,
}

#: a valid value other than the default for each flat name
OTHER = {
    "window_chars": 16, "max_steps": 9, "start": "chapter_start", "illegal_done": False, "split": "all",
    "heldout_fraction": 0.5, "split_seed": 3, "min_count": 2, "separator": "##", "max_run_chars": 5,
    "blacklist": ("x", "y"), "blacklist_path": "bl.txt", "whitelist_size": 7, "use_coverage": False,
    "use_infonce": False, "use_bigram_bonus": False, "use_garble": False, "use_illegal_penalty": False,
    "use_normalisation": False, "ngram_n": 4, "coverage_window_chars": 40, "lambda_cov": 2.0, "lambda_nce": 0.25,
    "lambda_gar": 0.3, "lambda_ill": 1.5, "lambda_bigram": 0.7, "bigram_match_bonus": 0.2, "lambda_target": 1.0,
    "garble_min_count": 4, "norm_beta": 0.01, "norm_eps": 1e-6, "norm_warmup": False, "potential_coef": 0.2,
    "potential_gamma": 0.9, "nce_context_chars": 4, "nce_hidden_dim": 16, "nce_embed_dim": 8, "nce_tau": 0.1,
    "nce_momentum": 0.9, "nce_queue_size": 16, "nce_lr": 1e-3, "nce_pairs_per_step": 32, "nce_pretrain_steps": 5,
    "nce_seed": 2, "use_jieba_lexicon": False, "augment_lexicon_with_reference": False, "lexicon_dir": "lex",
}


def _at(cfg, path: str):
    for part in path.split("."):
        cfg = getattr(cfg, part)
    return cfg


def test_the_alias_table_covers_every_old_name_with_its_old_default():
    assert set(FLAT_NAMES) == set(OLD_DEFAULTS) == set(OTHER)
    cfg = EnvConfig()
    for name, default in OLD_DEFAULTS.items():
        assert getattr(cfg, name) == default, name
        paths = (FLAT_NAMES[name],) if isinstance(FLAT_NAMES[name], str) else FLAT_NAMES[name]
        assert all(_at(cfg, p) == default for p in paths), name
    # no leaf field of a section lacks a flat name (every field the one-level config had is reachable)
    leaves = {f"{f.name}.{g.name}" for f, tp in fields_of(EnvConfig) for g, _ in fields_of(tp)}
    targets = {p for v in FLAT_NAMES.values() for p in ((v,) if isinstance(v, str) else v)}
    assert leaves == targets


@pytest.mark.parametrize("name", sorted(OTHER))
def test_flat_name_is_the_same_field_in_yaml_keywords_cli_and_attributes(name):
    value = OTHER[name]
    by_keyword = EnvConfig(**{name: value})
    by_yaml = from_dict(EnvConfig, {name: list(value) if isinstance(value, tuple) else value}, "env")
    paths = (FLAT_NAMES[name],) if isinstance(FLAT_NAMES[name], str) else FLAT_NAMES[name]
    nested: dict = {}
    for p in paths:
        head, leaf = p.split(".")
        nested.setdefault(head, {})[leaf] = value
    by_section = from_dict(EnvConfig, nested, "env")
    assert by_keyword == by_yaml == by_section
    assert getattr(by_keyword, name) == value
    assert all(_at(by_keyword, p) == value for p in paths)
    # the config round-trips through its nested form
    assert from_dict(EnvConfig, to_dict(by_keyword), "env") == by_keyword


def test_dotted_overrides_take_flat_and_nested_names(tmp_path):
    f = tmp_path / "env.yaml"
    f.write_text("window_chars: 16\ninfonce:\n  tau: 0.2\nlambda_cov: 2.0\n")
    cfg = load(EnvConfig, f, ["--nce_seed", "4", "--episode.max_steps", "9", "--window_chars", "8"])
    assert (cfg.episode.window_chars, cfg.episode.max_steps) == (8, 9)
    assert (cfg.infonce.tau, cfg.infonce.seed, cfg.coverage.weight) == (0.2, 4, 2.0)
    # a later layer wins whichever spelling each layer used
    assert load(EnvConfig, f, ["--episode.window_chars", "12"]).episode.window_chars == 12
    assert load(EnvConfig, f, ["--nce_tau", "0.3"]).infonce.tau == 0.3


def test_ngram_n_sets_both_rewards_and_each_can_be_set_alone():
    cfg = EnvConfig(ngram_n=4)
    assert cfg.coverage.ngram_n == cfg.infonce.ngram_n == 4
    split = from_dict(EnvConfig, {"coverage": {"ngram_n": 2}, "infonce": {"ngram_n": 5}})
    assert (split.coverage.ngram_n, split.infonce.ngram_n) == (2, 5)


def test_errors_name_the_key_as_written_with_the_value_and_the_fix():
    with pytest.raises(ConfigError, match=r"`env.nce_tau` = -1.0 must be > 0 \(τ: temperature"):
        from_dict(EnvConfig, {"nce_tau": -1}, "env")
    with pytest.raises(ConfigError, match=r"`env.infonce.tau` = -1.0 must be > 0"):
        from_dict(EnvConfig, {"infonce": {"tau": -1}}, "env")
    with pytest.raises(ConfigError, match=r"`env.window_chars` = 0 must be in \[1, 4096\]"):
        from_dict(EnvConfig, {"window_chars": 0}, "env")
    with pytest.raises(ConfigError, match=r"`env.start` = 'middle' is not one of random, chapter_start"):
        from_dict(EnvConfig, {"start": "middle"}, "env")
    with pytest.raises(ConfigError, match=r"`env.nce_lr` = 'fast' must be a number"):
        from_dict(EnvConfig, {"nce_lr": "fast"}, "env")
    with pytest.raises(ConfigError, match=r"unknown config key `env.windw_chars`. Did you mean `window_chars`"):
        from_dict(EnvConfig, {"windw_chars": 8}, "env")
    with pytest.raises(ConfigError, match=r"`env.nce_tau` = 0.1 and `env.infonce.tau` = 0.2 set the same field; "
                                          r"write it once"):
        from_dict(EnvConfig, {"nce_tau": 0.1, "infonce": {"tau": 0.2}}, "env")
    with pytest.raises(ConfigError, match="coverage_window_chars=2 must be >= ngram_n=3"):
        from_dict(EnvConfig, {"coverage": {"window_chars": 2}}, "env")
    with pytest.raises(TypeError, match="window_chrs"):
        EnvConfig(window_chrs=3)
    with pytest.raises(AttributeError, match="window_chrs"):
        _ = EnvConfig().window_chrs


def test_keywords_apply_on_top_of_a_section_and_replace_keeps_working():
    cfg = EnvConfig(infonce=InfoNCEConfig(tau=0.2, seed=5), nce_seed=6, window_chars=8)
    assert (cfg.infonce.tau, cfg.infonce.seed, cfg.episode.window_chars) == (0.2, 6, 8)
    assert dataclasses.replace(cfg, max_steps=5).episode == dataclasses.replace(cfg.episode, max_steps=5)


def test_the_env_hands_its_infonce_section_to_the_encoder(sample_chapters):
    assert InfoNCEConfig is EncoderConfig
    cfg = EnvConfig(nce_pretrain_steps=0, nce_hidden_dim=16, nce_embed_dim=8, nce_seed=1, window_chars=8)
    env = CharTextEnv(sample_chapters, config=cfg)
    assert env.encoder.cfg is cfg.infonce


def test_sac_configs_keep_their_flat_env_keys_and_layer_either_spelling():
    from lmpo.textagent.sac.config import apply_overrides, load_config

    for name in ("sac_cpu.yaml", "sac_gpu.yaml"):
        cfg = load_config(ROOT / "configs" / name)
        env = cfg.env_config()
        assert env.episode.window_chars == cfg.env["window_chars"] and env.episode.max_steps == 64
    cpu = load_config(ROOT / "configs" / "sac_cpu.yaml")
    assert cpu.env_config().lexical.target_bonus == 1.0
    nested = apply_overrides(cpu, {"env": {"episode": {"window_chars": 24}}})
    assert nested.env_config().episode.window_chars == 24 and "window_chars" not in nested.env
    flat = apply_overrides(nested, {"env.window_chars": 12})
    assert flat.env_config().episode.window_chars == 12 and "episode" not in flat.env
