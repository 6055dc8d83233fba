#!/usr/bin/env bash
# Join a worker node to the cluster. Usage: RAY_AUTH_TOKEN=<token> deploy/ray-worker.sh HEAD_IP[:PORT]
set -euo pipefail
: "${RAY_AUTH_TOKEN:?set RAY_AUTH_TOKEN (the head node's token)}"
export RAY_AUTH_MODE=token
head="$1"; [[ "$head" == *:* ]] || head="$head:6380"
ray start --address="$head" --num-gpus="$(nvidia-smi -L 2>/dev/null | wc -l)"
