#!/usr/bin/env bash
# Checks that every publishable crate of the workspace can be published: runs
# `cargo package` with verification on all of them at once, so each crate's .crate
# tarball is unpacked and built on its own, against the tarballs of the workspace
# crates it depends on (cargo puts those in a temporary local registry; none of them
# needs to be on crates.io). Prints one summary line per crate and exits non-zero if
# any crate fails to package or to build from its tarball.
#
# The working tree is packaged as it is (--allow-dirty): run it before committing too.
# Extra arguments go to `cargo package` (e.g. --offline, --locked).
#
# The publishable crates are listed below; the script fails if a workspace member
# without `publish = false` is missing from the list (the unpublished integration
# crate and the fuzz crate, a workspace of its own, are not checked).
set -uo pipefail
cd "$(dirname "$0")/.."

crates=(
  tenure
  tenure-core
  tenure-etcd
  tenure-redis
  tenure-zookeeper
  tenure-azure
  tenure-postgres
  tenure-peer
  tenure-shard
  tenure-cli
)

# The [package] name of a manifest, and whether it says `publish = false`.
package_name() {
  awk '/^\[/ { in_pkg = ($0 == "[package]") } in_pkg && /^name *=/ { gsub(/[" ]/, "", $0); sub(/^name=/, "", $0); print; exit }' "$1"
}
unpublished() {
  awk '/^\[/ { in_pkg = ($0 == "[package]") } in_pkg && /^publish *= *false/ { found = 1 } END { exit !found }' "$1"
}

missing=0
for manifest in Cargo.toml crates/*/Cargo.toml integration/Cargo.toml; do
  [[ -f "$manifest" ]] || continue
  name="$(package_name "$manifest")"
  [[ -n "$name" ]] || continue
  if unpublished "$manifest"; then
    continue
  fi
  listed=0
  for c in "${crates[@]}"; do [[ "$c" == "$name" ]] && listed=1; done
  if (( !listed )); then
    echo "package-check: $name ($manifest) is publishable but not in scripts/package-check.sh's list" >&2
    missing=1
  fi
done
if (( missing )); then
  exit 1
fi

args=()
for c in "${crates[@]}"; do args+=(-p "$c"); done

# cargo unpacks the temporary registry's tarballs under $CARGO_HOME/registry/src/-<hash>/
# (the hash is of the registry's path, so the same for every run from one checkout) and
# reuses an unpacked crate of the same name and version without looking at the new
# tarball: a second run after a change verified the crates against the first run's
# sources ("no `Tag` in `backend`"). Remove earlier unpackings of these crates first;
# crates.io's unpackings (in index.crates.io-…) are not touched.
cargo_home="${CARGO_HOME:-$HOME/.cargo}"
for c in "${crates[@]}"; do
  rm -rf "$cargo_home"/registry/src/-*/"$c"-[0-9]*
done
# The same holds for what cargo built from those copies: a registry crate of one
# name and version counts as unchanged, so a second run in the same target directory
# built the new tarball of one crate against the first run's build of another ("no
# field `zone` on type `NodeInfo`"). Remove these crates' builds first (their
# dependencies' stay); a fresh target directory, as in CI, has none.
for c in "${crates[@]}"; do
  cargo clean -q -p "$c" >/dev/null 2>&1 || true
done

log="$(mktemp "${TMPDIR:-/tmp}/package-check.XXXXXX")"
trap 'rm -f "$log"' EXIT
start=$SECONDS
echo "package-check: cargo package with verification of ${#crates[@]} crates (cargo's output only if it fails)" >&2
cargo package --allow-dirty "${args[@]}" "$@" >"$log" 2>&1
rc=$?
elapsed=$((SECONDS - start))

# Per crate: what `Packaged …` said, and whether its `Verifying …` build finished.
# cargo verifies the crates one after another and stops at the first failure, so a
# crate verified before the last `Verifying` line is fine, and the last one is fine
# if cargo succeeded.
last_verifying="$(grep -E '^ *Verifying ' "$log" | tail -n 1 | awk '{print $2}')"
if (( rc != 0 )); then
  echo "package-check: cargo package failed (exit $rc); its last lines:"
  grep -vE '^ *(Compiling|Downloaded|Downloading|Updating|Locking|Adding|Blocking) ' "$log" | tail -n 40
  echo
fi
failed=0
printf '%-18s %-40s %s\n' crate packaged verified
for c in "${crates[@]}"; do
  packaged="$(awk -v c="$c" '
    $1 == "Packaging" && $2 == c { want = 1; next }
    want && $1 == "Packaged" { $1 = ""; sub(/^ /, ""); print; exit }' "$log")"
  if ! grep -qE "^ *Verifying $c v" "$log"; then
    verified="not reached"
    failed=1
  elif [[ "$c" == "$last_verifying" && $rc -ne 0 ]]; then
    verified="FAILED"
    failed=1
  else
    verified="ok"
  fi
  printf '%-18s %-40s %s\n' "$c" "${packaged:-–}" "$verified"
done
if (( rc != 0 || failed )); then
  echo "package-check: FAILED after ${elapsed}s"
  exit 1
fi
echo "package-check: all ${#crates[@]} crates package and build from their tarballs (${elapsed}s)"
