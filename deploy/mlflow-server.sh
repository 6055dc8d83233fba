#!/usr/bin/env bash
# MLflow tracking server backed by PostgreSQL, for the team's UI and as the launches' tracking URI.
# Usage: MLFLOW_DB=postgresql+psycopg://mlflow@db-host/mlflow ARTIFACTS=/shared/mlflow-artifacts deploy/mlflow-server.sh
set -euo pipefail
: "${MLFLOW_DB:?set MLFLOW_DB, e.g. postgresql+psycopg://mlflow@db-host/mlflow}"
exec mlflow server \
  --backend-store-uri "$MLFLOW_DB" \
  --artifacts-destination "${ARTIFACTS:-./mlflow-artifacts}" \
  --host 0.0.0.0 --port "${PORT:-5000}"
