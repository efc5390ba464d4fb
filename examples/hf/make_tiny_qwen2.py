"""Build a tiny Qwen2 chat model, a reward model and conversational JSONL data offline (nothing is downloaded).

    python examples/hf/make_tiny_qwen2.py runs/qwen2

writes, as Hugging Face directories that ``from_pretrained`` loads:

- ``runs/qwen2/policy/``: a randomly initialised ``Qwen2ForCausalLM`` (config.json, model.safetensors,
  generation_config.json) with a character-level ``PreTrainedTokenizerFast`` carrying Qwen2's ChatML chat
  template (``lmpo.models.build_chat_tokenizer``; EOS ``<|im_end|>``, pad ``<|endoftext|>``);
- ``runs/qwen2/reward_model/``: a randomly initialised ``Qwen2ForSequenceClassification`` with one label and
  the same tokenizer (its chat template renders the conversation it scores);
- ``runs/qwen2/train.jsonl`` and ``test.jsonl``: addition problems in TRL's conversational format
  (``{"prompt": [{"role": "system", …}, {"role": "user", "content": "3+4="}], "answer": "7"}``).

The sizes are tiny (d=64, 2 layers: 0.1M parameters) so that the end-to-end example in docs/trainer.md
(``examples/hf/qwen2_end_to_end.sh``) runs in seconds on a CPU. Both models are random: the example shows the
plumbing, not a result.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2ForSequenceClassification

from lmpo.models import build_chat_tokenizer


def qwen2_config(tokenizer, hidden_size: int = 64, num_layers: int = 2, **extra) -> Qwen2Config:
    """A small Qwen2 config for ``tokenizer`` (grouped-query attention: 4 query heads, 2 key/value heads)."""
    return Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                       num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=256, pad_token_id=tokenizer.pad_token_id,
                       eos_token_id=tokenizer.eos_token_id, bos_token_id=None, tie_word_embeddings=True, **extra)


def write_chat_jsonl(path: Path, pairs: list[tuple[int, int]]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for a, b in pairs:
            row = {"prompt": [{"role": "system", "content": "Reply with the sum only."},
                              {"role": "user", "content": f"{a}+{b}="}], "answer": str(a + b)}
            fh.write(json.dumps(row) + "\n")


def make(out: str | Path, seed: int = 0, hidden_size: int = 64, num_layers: int = 2) -> dict[str, Path]:
    """Write policy/, reward_model/, train.jsonl and test.jsonl into ``out``; returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    tokenizer = build_chat_tokenizer()
    policy = Qwen2ForCausalLM(qwen2_config(tokenizer, hidden_size, num_layers))
    policy.generation_config.eos_token_id = tokenizer.eos_token_id  # <|im_end|> ends an assistant turn
    policy.generation_config.pad_token_id = tokenizer.pad_token_id
    policy.save_pretrained(out / "policy")
    tokenizer.save_pretrained(out / "policy")
    reward_model = Qwen2ForSequenceClassification(qwen2_config(tokenizer, hidden_size, num_layers, num_labels=1))
    reward_model.save_pretrained(out / "reward_model")
    tokenizer.save_pretrained(out / "reward_model")
    pairs = [(a, b) for a in range(10) for b in range(10)]
    random.Random(seed).shuffle(pairs)
    write_chat_jsonl(out / "train.jsonl", pairs[:80])
    write_chat_jsonl(out / "test.jsonl", pairs[80:])
    return {name: out / name for name in ("policy", "reward_model", "train.jsonl", "test.jsonl")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="output directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=2)
    args = parser.parse_args(argv)
    for name, path in make(args.out, args.seed, args.hidden_size, args.num_layers).items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
