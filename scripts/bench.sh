#!/usr/bin/env bash
# Reproduce the README's bench table: install the servers if missing, start local etcd,
# Redis, ZooKeeper, PostgreSQL and Azurite with the test harness, run `tenure bench`'s measurements
# on them and on the in-memory backend, print the Markdown table, write bench.svg.
# Extra arguments go to the bench (e.g. --runs 50 --no-azure).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-test-deps.sh >&2
exec cargo run --quiet --release -p tenure-integration --example bench_all -- "$@"
