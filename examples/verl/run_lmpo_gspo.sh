#!/usr/bin/env bash
# lmpo's GSPO objective on a multi-node verl 0.9.1 cluster (Ray, FSDP, vLLM).
#
# 1. Every node: the same Python environment with `pip install 'lmpo[verl]' vllm` and the data at the
#    same path (python3 verl/examples/data_preprocess/gsm8k.py --local_save_dir ~/data/gsm8k).
# 2. Start Ray:
#      head node:    ray start --head --port=6379 --dashboard-host=0.0.0.0
#      other nodes:  ray start --address=<head-ip>:6379
#      check:        ray status        # NNODES x GPUS_PER_NODE GPUs listed
# 3. On the head node: bash examples/verl/run_lmpo_gspo.sh [extra hydra overrides]
#    e.g.  bash examples/verl/run_lmpo_gspo.sh actor_rollout_ref.actor.policy_loss.loss_mode=lmpo_dapo \
#              actor_rollout_ref.actor.loss_agg_mode=token-mean
#    verl's main_ppo calls ray.init() without an address, which joins the cluster started on this node.
#    Alternatively submit from anywhere: ray job submit --address=http://<head-ip>:8265 -- bash <this script>
set -euo pipefail

NNODES=${NNODES:-2}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

python3 -c "import lmpo.integrations.verl as m; print('lmpo losses:', ', '.join(m.REGISTERED_LOSS_MODES))"

python3 -m verl.trainer.main_ppo \
    --config-path="${HERE}/config" \
    --config-name=lmpo_gspo \
    trainer.nnodes="${NNODES}" \
    trainer.n_gpus_per_node="${GPUS_PER_NODE}" \
    "$@"
