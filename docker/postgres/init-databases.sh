#!/usr/bin/env bash
# Runs once, on the first start of an empty data volume (the postgres image's initdb hook):
# Airflow's metadata DB and the Statekeeper catalog live in one server as two databases, each
# with its own owner, so either can be moved to its own server later without a schema change.
set -euo pipefail

create() {
  local user=$1 password=$2 database=$3
  psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
    -v user="$user" -v password="$password" -v database="$database" <<'SQL'
CREATE ROLE :"user" LOGIN PASSWORD :'password';
CREATE DATABASE :"database" OWNER :"user";
SQL
}

create "$AIRFLOW_DB_USER" "$AIRFLOW_DB_PASSWORD" airflow
create "$STATEKEEPER_DB_USER" "$STATEKEEPER_DB_PASSWORD" statekeeper
