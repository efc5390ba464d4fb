#!/usr/bin/env bash
# lmpo objective in TRL 1.16 on one 8-GPU node: a vLLM server on 2 GPUs generates, 6 GPUs train with
# DeepSpeed ZeRO-3 through accelerate. Needs: pip install 'lmpo[trl]' vllm deepspeed.
# Usage: bash examples/trl/launch_vllm_server.sh [extra train_lmpo_trl.py flags, e.g. --preset dapo]
set -euo pipefail

MODEL=${MODEL:-Qwen/Qwen2.5-7B-Instruct}
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# 1. generation server (TRL's own CLI); the trainer pushes weights to it after each optimizer step
CUDA_VISIBLE_DEVICES=0,1 trl vllm-serve --model "${MODEL}" --tensor-parallel-size 2 &
SERVER_PID=$!
trap 'kill ${SERVER_PID}' EXIT
# wait for the server's health endpoint (port 8000 by default)
until curl -sf http://localhost:8000/health/ >/dev/null; do sleep 5; done

# 2. training processes
CUDA_VISIBLE_DEVICES=2,3,4,5,6,7 accelerate launch \
    --config_file "${HERE}/accelerate_zero3.yaml" --num_processes 6 \
    "${HERE}/train_lmpo_trl.py" \
    --model "${MODEL}" --task openai/gsm8k --task-option subset=main \
    --task-option $'prompt_template=Question: {question}\nAnswer:' --reward numeric_match \
    --preset gspo --use-vllm --vllm-mode server --bf16 \
    --prompts-per-device 2 --completions-per-prompt 8 --grad-accum 4 --max-completion-length 1024 \
    "$@"
