#!/usr/bin/env bash
# The team's MLflow tracking server: runs in PostgreSQL, every request authenticated (MLflow's
# basic-auth app; users in a second database), the UI for everyone with an account.
#
#   MLFLOW_DB=postgresql+psycopg://mlflow@db-host/mlflow \
#   MLFLOW_AUTH_DB=postgresql+psycopg://mlflow@db-host/mlflow_auth \
#   MLFLOW_AUTH_ADMIN_PASSWORD=... MLFLOW_FLASK_SERVER_SECRET_KEY=... deploy/mlflow-server.sh
#
# The secret key signs the UI's CSRF tokens (the same on every server replica; e.g. `openssl rand -hex 32`).
# The admin password is read once, when the user database is empty (MLflow then creates `admin`);
# add users for people and launches through MLflow's UI or its users API. Give a database password
# in ~/.pgpass or PGPASSWORD, not in the URIs (they are on this process's command line).
# A launch then authenticates from its environment, as MLflow's client does:
#   MLFLOW_TRACKING_URI=http://mlflow-host:5000 MLFLOW_TRACKING_USERNAME=... MLFLOW_TRACKING_PASSWORD=... orchestrator launch FILE
# Needs `pip install -e '.[server]'` (MLflow's auth extra). ALLOWED_HOSTS: the host:port names
# clients use (MLflow refuses other Host headers).
set -euo pipefail
: "${MLFLOW_DB:?set MLFLOW_DB, e.g. postgresql+psycopg://mlflow@db-host/mlflow}"
: "${MLFLOW_AUTH_DB:?set MLFLOW_AUTH_DB (where the users live), e.g. postgresql+psycopg://mlflow@db-host/mlflow_auth}"
: "${MLFLOW_FLASK_SERVER_SECRET_KEY:?set MLFLOW_FLASK_SERVER_SECRET_KEY (it signs the CSRF tokens of the UI), e.g. the output of: openssl rand -hex 32}"
config="$(mktemp "${TMPDIR:-/tmp}/mlflow-auth.XXXXXX.ini")"  # mode 600: it names the user database
trap 'rm -f "$config"' EXIT
cat > "$config" <<EOF
[mlflow]
default_permission = ${DEFAULT_PERMISSION:-READ}
database_uri = ${MLFLOW_AUTH_DB}
admin_username = ${MLFLOW_AUTH_ADMIN_USERNAME:-admin}
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
EOF
MLFLOW_AUTH_CONFIG_PATH="$config" mlflow server --app-name basic-auth \
  --backend-store-uri "$MLFLOW_DB" \
  --artifacts-destination "${ARTIFACTS:-./mlflow-artifacts}" \
  --host "${HOST:-0.0.0.0}" --port "${PORT:-5000}" \
  ${ALLOWED_HOSTS:+--allowed-hosts "$ALLOWED_HOSTS"}
