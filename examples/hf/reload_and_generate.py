"""Load a model directory with plain ``transformers`` (no lmpo) and answer one chat prompt greedily.

    python examples/hf/reload_and_generate.py runs/qwen2/exported "3+4="

What ``lmpo export`` (or a run's ``model/``) wrote is an ordinary Hugging Face model: ``AutoModelForCausalLM``
and ``AutoTokenizer`` load it, and the tokenizer's chat template renders the conversation.
"""

from __future__ import annotations

import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def generate(model_dir: str, question: str, max_new_tokens: int = 4) -> str:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    messages = [{"role": "system", "content": "Reply with the sum only."}, {"role": "user", "content": question}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)


if __name__ == "__main__":
    model_dir, question = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "3+4=")
    print(f"{type(AutoModelForCausalLM.from_pretrained(model_dir)).__name__} from {model_dir}: "
          f"{question!r} -> {generate(model_dir, question)!r}")
