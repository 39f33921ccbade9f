#!/usr/bin/env bash
# One-shot setup before the Airflow services start: Airflow's metadata DB, the login, the
# Statekeeper catalog. Every step is idempotent, so `docker compose up` can run it every time.
set -euo pipefail

airflow db migrate

# SimpleAuthManager reads passwords from this file (shared by the services through a volume).
# Written from AIRFLOW_ADMIN_PASSWORD so the login is known instead of generated per container.
python - <<'PY'
import json, os
path = os.environ["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]
os.makedirs(os.path.dirname(path), exist_ok=True)
with open(path, "w") as out:
    json.dump({"admin": os.environ["AIRFLOW_ADMIN_PASSWORD"]}, out)
PY

statectl catalog upgrade
statectl catalog current

echo "Statekeeper on Airflow: http://localhost:${AIRFLOW_UI_PORT:-8080}/ (Browse > Statekeeper)"
echo "Login: admin / the AIRFLOW_ADMIN_PASSWORD set in .env"
