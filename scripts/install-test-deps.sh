#!/usr/bin/env bash
# Installs what tenure's integration tests and builds need, and only what is
# missing:
#   - apt: etcd-server, etcd-client (etcdctl), zookeeper,
#     libcurator-recipes-java (Apache Curator with its framework and client,
#     for the Curator LeaderLatch interop test), redis-server, and npm if it
#     is missing (TLS test certificates are made in the tests with rcgen);
#     no protoc: no crate of the workspace needs it to build;
#   - npm: azurite@3 into .tools/azurite (project-local, git-ignored).
# Idempotent. Prints nothing when everything is present, one summary line
# when it installed something, and the installer's output when it fails.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
azurite_dir="$root/.tools/azurite"
azurite_bin="$azurite_dir/node_modules/.bin/azurite-blob"

# "package:what shows it is there" — a command name or an absolute path.
checks=(
  "etcd-server:etcd"
  "etcd-client:etcdctl"
  "zookeeper:/usr/share/java/zookeeper.jar"
  "libcurator-recipes-java:/usr/share/java/curator-recipes.jar"
  "redis-server:redis-server"
)

present() {
  case "$1" in
    /*) [[ -e "$1" ]] ;;
    *) command -v "$1" >/dev/null 2>&1 ;;
  esac
}

missing=()
for check in "${checks[@]}"; do
  package="${check%%:*}"
  marker="${check#*:}"
  present "$marker" || missing+=("$package")
done
need_azurite=0
[[ -x "$azurite_bin" ]] || need_azurite=1
if ((need_azurite)) && ! present npm; then
  missing+=(npm)
fi

log="$(mktemp)"
trap 'rm -f "$log"' EXIT

run_logged() {
  if ! "$@" >>"$log" 2>&1; then
    echo "install-test-deps: failed: $*" >&2
    cat "$log" >&2
    exit 1
  fi
}

summary=()
if ((${#missing[@]})); then
  sudo=()
  if ((EUID != 0)); then
    sudo=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  run_logged "${sudo[@]}" apt-get update -qq
  run_logged "${sudo[@]}" apt-get install -y -qq "${missing[@]}"
  summary+=("apt: ${missing[*]}")
fi

if ((need_azurite)); then
  mkdir -p "$azurite_dir"
  run_logged npm install --prefix "$azurite_dir" azurite@3 --no-audit --no-fund --loglevel=error
  if [[ ! -x "$azurite_bin" ]]; then
    echo "install-test-deps: npm finished but $azurite_bin is missing" >&2
    cat "$log" >&2
    exit 1
  fi
  summary+=("npm: azurite@3 in .tools/azurite")
fi

if ((${#summary[@]})); then
  joined="$(printf '%s; ' "${summary[@]}")"
  echo "install-test-deps: installed ${joined%; }"
fi
