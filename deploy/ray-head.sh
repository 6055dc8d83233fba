#!/usr/bin/env bash
# Start the Ray head node. Usage: RAY_AUTH_TOKEN=<token> deploy/ray-head.sh [port]
# Generate a token once with: python -c "import secrets; print(secrets.token_hex(32))"
set -euo pipefail
: "${RAY_AUTH_TOKEN:?set RAY_AUTH_TOKEN (shared by every node and the driver)}"
export RAY_AUTH_MODE=token
ray start --head --port="${1:-6380}" --dashboard-host=0.0.0.0 --num-gpus="$(nvidia-smi -L 2>/dev/null | wc -l)"
