#!/usr/bin/env bash
# A throwaway PostgreSQL server for sweeps that span machines (sweep.py --storage).
#
#   scripts/postgres.sh start DATA_DIR PORT   # initdb if needed, start on 127.0.0.1:PORT,
#                                             # create database 'sweeps'; prints the storage URL
#   scripts/postgres.sh stop DATA_DIR         # fast shutdown
#
# Uses Debian's PostgreSQL binaries (apt-get install postgresql). PostgreSQL refuses to run
# as root, so as root the server runs as the 'postgres' user. Authentication is 'trust' on
# loopback only: a test and development server, not one to expose.
set -euo pipefail

find_bin() {
  local name=$1 found
  found=$(command -v "$name" 2>/dev/null || ls /usr/lib/postgresql/*/bin/"$name" 2>/dev/null | tail -1 || true)
  if [ -z "$found" ]; then
    echo "error: PostgreSQL's $name not found: install the server (apt-get install postgresql)." >&2
    exit 1
  fi
  echo "$found"
}

as_owner() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

command=${1:-}
data_dir=${2:-}
if [ -z "$command" ] || [ -z "$data_dir" ]; then
  echo "usage: $0 start DATA_DIR PORT | stop DATA_DIR" >&2
  exit 2
fi
pg_ctl=$(find_bin pg_ctl)
case "$command" in
  start)
    port=${3:?usage: $0 start DATA_DIR PORT}
    initdb=$(find_bin initdb)
    mkdir -p "$data_dir"
    if [ "$(id -u)" -eq 0 ]; then chown postgres "$data_dir"; fi
    if [ ! -f "$data_dir/PG_VERSION" ]; then
      as_owner "$initdb" -D "$data_dir" -U postgres --auth=trust >"$data_dir.initdb.log" 2>&1 || {
        echo "error: initdb failed, see $data_dir.initdb.log" >&2; exit 1; }
    fi
    as_owner "$pg_ctl" -D "$data_dir" -l "$data_dir/server.log" -w -t 60 \
      -o "-h 127.0.0.1 -p $port -k $data_dir" start >/dev/null
    psql=$(find_bin psql)
    "$psql" -h 127.0.0.1 -p "$port" -U postgres -tAc \
      "SELECT 1 FROM pg_database WHERE datname = 'sweeps'" | grep -q 1 ||
      "$psql" -h 127.0.0.1 -p "$port" -U postgres -qc "CREATE DATABASE sweeps"
    echo "postgresql://postgres@127.0.0.1:$port/sweeps"
    ;;
  stop)
    as_owner "$pg_ctl" -D "$data_dir" -m fast -w stop >/dev/null
    ;;
  *)
    echo "usage: $0 start DATA_DIR PORT | stop DATA_DIR" >&2
    exit 2
    ;;
esac
