#!/usr/bin/env bash
# A Qwen2 chat model from scratch to a Hugging Face model directory, offline (docs/trainer.md, the same lines).
set -euo pipefail
python examples/hf/make_tiny_qwen2.py runs/qwen2
lmpo train examples/hf/qwen2_chat.yaml --loop.steps 2 --overwrite
lmpo export runs/qwen2/run runs/qwen2/exported
python examples/hf/reload_and_generate.py runs/qwen2/exported "3+4="
lmpo eval runs/qwen2/exported --task runs/qwen2/test.jsonl --max-new-tokens 4
lmpo eval runs/qwen2/run
