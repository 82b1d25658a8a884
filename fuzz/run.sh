#!/usr/bin/env bash
# Runs every cargo-fuzz target for SECONDS (default 60) each; installs cargo-fuzz first
# if it is missing. Needs a nightly toolchain. Not part of the default test run.
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-60}"
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz
fi
for target in url_config names timing peer_frames; do
  log="$(mktemp)"
  if ! cargo +nightly fuzz run "$target" -- -max_total_time="$seconds" >"$log" 2>&1; then
    tail -40 "$log"
    echo "fuzz: $target FAILED (input in fuzz/artifacts/$target/)" >&2
    rm -f "$log"
    exit 1
  fi
  execs="$(grep -Eo 'Done [0-9]+ runs' "$log" | tail -1 || true)"
  echo "fuzz: $target clean for ${seconds}s (${execs:-see log})"
  rm -f "$log"
done
