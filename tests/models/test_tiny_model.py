"""Character tokenizer and the tiny preset: offline build, round trips, Auto* loading."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM, PreTrainedTokenizer

from lmpo.models import MODEL_PRESETS, CharTokenizer, build_tiny_model, load_model_and_tokenizer
from lmpo.models.tokenizer import BASE_CHARS


def test_tokenizer_ids_and_round_trip():
    tok = CharTokenizer()
    assert isinstance(tok, PreTrainedTokenizer)
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert len(tok) == 4 + len(BASE_CHARS) == 100
    # '1' is the 2nd digit -> id 4 + 1 = 5; '+' sits after digits and letters
    assert tok("12+34=")["input_ids"] == [1, 5, 6, 4 + BASE_CHARS.index("+"), 7, 8, 4 + BASE_CHARS.index("=")]
    text = "Hello, world!\n  a  b {x}"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text) and tok.decode(ids) == text
    assert tok.decode(tok(text)["input_ids"] + [tok.eos_token_id], skip_special_tokens=True) == text
    assert tok("é", add_special_tokens=False)["input_ids"] == [tok.unk_token_id]


def test_tokenizer_batch_padding_left_and_right():
    tok = CharTokenizer()
    enc = tok(["ab", "abcd"], padding=True, return_tensors="pt")
    assert enc["input_ids"].tolist() == [[0, 0, 1, 14, 15], [1, 14, 15, 16, 17]]
    assert enc["attention_mask"].tolist() == [[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]
    right = tok(["ab", "abcd"], padding=True, padding_side="right")["input_ids"]
    assert right[0] == [1, 14, 15, 0, 0]
    assert tok.batch_decode(enc["input_ids"], skip_special_tokens=True) == ["ab", "abcd"]


def test_tokenizer_save_load_with_extra_chars(tmp_path):
    tok = CharTokenizer(extra_chars="éü你")
    assert len(tok) == 103
    tok.save_pretrained(tmp_path)
    for loaded in (CharTokenizer.from_pretrained(tmp_path), AutoTokenizer.from_pretrained(tmp_path)):
        assert type(loaded) is CharTokenizer and len(loaded) == 103 and loaded.padding_side == "left"
        assert loaded("aé你")["input_ids"] == tok("aé你")["input_ids"] == [1, 14, 100, 102]
        assert loaded.decode([100, 101, 102]) == "éü你"


def test_tiny_model_builds_offline_and_runs():
    tok = CharTokenizer()
    model = build_tiny_model(tok, "tiny", seed=0)
    assert isinstance(model, LlamaForCausalLM)
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.vocab_size) == (
        128,
        4,
        4,
        100,
    )
    assert cfg.eos_token_id == tok.eos_token_id and model.generation_config.pad_token_id == tok.pad_token_id
    # tied embeddings: 100·128 + 4·(4·128² + 3·128·256 + 2·128) + 128 = 669,312 parameters
    assert sum(p.numel() for p in model.parameters()) == 669_312
    enc = tok(["1+1=", "99+99="], padding=True, return_tensors="pt")
    logits = model(**enc).logits
    assert logits.shape == (2, 7, 100) and torch.isfinite(logits).all()
    same = build_tiny_model(tok, "tiny", seed=0)
    other = build_tiny_model(tok, "tiny", seed=1)
    assert torch.equal(same.lm_head.weight, model.lm_head.weight)
    assert not torch.equal(other.lm_head.weight, model.lm_head.weight)


def test_build_does_not_touch_global_rng():
    state = torch.random.get_rng_state()
    build_tiny_model(CharTokenizer(), seed=3)
    assert torch.equal(state, torch.random.get_rng_state())


def test_save_and_auto_load_round_trip(tmp_path):
    model, tok = load_model_and_tokenizer("tiny", seed=0)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    enc = tok(["12+34=", "5+6="], padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = model(**enc).logits
    model2, tok2 = load_model_and_tokenizer(str(tmp_path))
    auto_model = AutoModelForCausalLM.from_pretrained(tmp_path)
    auto_tok = AutoTokenizer.from_pretrained(tmp_path)
    assert type(tok2) is CharTokenizer and type(auto_tok) is CharTokenizer
    with torch.no_grad():
        torch.testing.assert_close(model2(**enc).logits, expected, rtol=0, atol=0)
        torch.testing.assert_close(auto_model(**enc).logits, expected, rtol=0, atol=0)


def test_presets_and_errors():
    assert {"tiny", "tiny-wide"} <= set(MODEL_PRESETS)
    model, _ = load_model_and_tokenizer("tiny", dtype="bf16")
    assert model.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="unknown model preset"):
        build_tiny_model(CharTokenizer(), "huge")
    with pytest.raises(ValueError, match="unknown dtype"):
        load_model_and_tokenizer("tiny", dtype="float8")
    with pytest.raises(ValueError, match="neither a built-in preset"):
        load_model_and_tokenizer("not-a-model")
    with pytest.raises(ValueError, match="hidden_size"):
        build_tiny_model(CharTokenizer(), "tiny", num_heads=3)


def test_the_tiny_template_names_the_tools_and_renders_turns_incrementally(tmp_path):
    """`model.name: tiny` on an environment: the character tokenizer's template (lmpo.models.chat) writes a tool
    line from the schemas, ends each message with EOS, and its observation suffix follows a turn's stop token."""
    from lmpo.envs import make_env
    from lmpo.envs.tools import Tool
    from lmpo.generation.episodes import ChatRenderer
    from lmpo.models.chat import TINY_CHAT_TEMPLATE

    tok = CharTokenizer()
    tok.chat_template = TINY_CHAT_TEMPLATE
    env = make_env("ToolArithmetic-v0")
    messages, _ = env.reset(seed=0)

    def convert(value: float, unit: str) -> str:
        """Convert.

        Args:
            value: the amount.
            unit: its unit.
        """
        return ""

    tools = [*env.tool_schemas, Tool.from_function(convert).schema]
    renderer = ChatRenderer(tok)
    opening = renderer.render(messages, True, tools)
    assert opening == f"tools: calculator(expression), convert(value, unit)<eos>\nuser: {messages[0]['content']}<eos>\nassistant: "
    assert renderer.render(messages, True) == f"user: {messages[0]['content']}<eos>\nassistant: "  # no tools: no line
    suffix = renderer.observation_ids([{"role": "tool", "name": "calculator", "content": "42"}], tok.eos_token_id, tools)
    assert tok.decode(suffix) == "\ntool: 42<eos>\nassistant: "
    tok.save_pretrained(tmp_path)  # a warmed-up model directory keeps it
    assert AutoTokenizer.from_pretrained(tmp_path).chat_template == TINY_CHAT_TEMPLATE
