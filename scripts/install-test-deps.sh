#!/usr/bin/env bash
# Installs what tenure's integration tests and builds need, and only what is
# missing:
#   - etcd and etcdctl 3.5 into .tools/etcd/bin (project-local, git-ignored),
#     from Debian trixie's etcd-server and etcd-client packages, fetched with a
#     private apt state so the machine's own sources are left as they are
#     (bookworm has 3.4.23): 3.5.16 checks leadership before a raft leader
#     revokes leases, which narrows etcd issue 15247 (a paused leader
#     revoking live leases as it resumes; see the etcd README), and 3.5 is the
#     faster store at 10^5 shards;
#   - apt: zookeeper,
#     libcurator-recipes-java (Apache Curator with its framework and client,
#     for the Curator LeaderLatch interop test), redis-server, postgresql
#     (initdb, postgres and psql in /usr/lib/postgresql/<version>/bin, not in
#     PATH; checked there, and the harness looks there; it also creates the
#     `postgres` user the harness runs the server as when it is root), and
#     npm if it is missing (TLS test certificates are made in the tests with
#     rcgen);
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
# Debian keeps PostgreSQL's server programs out of PATH, one directory per version.
if ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
  missing+=(postgresql)
fi
etcd_dir="$root/.tools/etcd"
# The etcd 3.5 measured here (its binary has the leadership check before a
# lease is revoked); trixie's package is at least that.
etcd_min_patch=16
need_etcd=1
if [[ -x "$etcd_dir/bin/etcd" && -x "$etcd_dir/bin/etcdctl" ]]; then
  need_etcd=0
fi
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

if ((need_etcd)); then
  apt_dir="$(mktemp -d)"
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/debs" "$apt_dir/root"
  echo "deb http://deb.debian.org/debian trixie main" >"$apt_dir/sources.list"
  apt_opts=(
    -o "Dir::Etc::sourcelist=$apt_dir/sources.list"
    -o "Dir::Etc::sourceparts=/dev/null"
    -o "Dir::State::Lists=$apt_dir/lists"
    -o "Dir::Cache::archives=$apt_dir/debs"
    -o "APT::Sandbox::User=root"
  )
  run_logged apt-get "${apt_opts[@]}" update -qq
  (cd "$apt_dir/debs" && run_logged apt-get "${apt_opts[@]}" download etcd-server etcd-client)
  for deb in "$apt_dir"/debs/*.deb; do
    run_logged dpkg-deb -x "$deb" "$apt_dir/root"
  done
  version="$("$apt_dir/root/usr/bin/etcd" --version 2>/dev/null | sed -n 's/^etcd Version: //p')"
  minor="${version#3.}"
  minor="${minor%%.*}"
  patch="${version##*.}"
  if [[ "$version" != 3.* ]] || ((minor < 5)) || ((minor == 5 && patch < etcd_min_patch)); then
    echo "install-test-deps: Debian trixie's etcd is '$version'; at least 3.5.$etcd_min_patch is needed" >&2
    exit 1
  fi
  mkdir -p "$etcd_dir/bin"
  cp "$apt_dir/root/usr/bin/etcd" "$apt_dir/root/usr/bin/etcdctl" "$etcd_dir/bin/"
  rm -rf "$apt_dir"
  summary+=("etcd $version in .tools/etcd")
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
