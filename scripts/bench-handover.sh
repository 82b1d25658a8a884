#!/usr/bin/env bash
# Graceful handover beside the stores' own recipes, in one run: tenure against
# `etcdctl elect` on etcd and against kazoo's Election on ZooKeeper (see
# integration/examples/bench_handover.rs). Installs the servers if missing, and kazoo
# from PyPI into .tools/python (project-local, git-ignored) if it is not there.
# Extra arguments go to the bench (e.g. --runs 50).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-test-deps.sh >&2
if ! PYTHONPATH=.tools/python python3 -c 'import kazoo' 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check --target .tools/python 'kazoo==2.11.0' >&2
fi
exec cargo run --quiet --release -p tenure-integration --example bench_handover -- "$@"
