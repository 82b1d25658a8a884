#!/usr/bin/env bash
# Install what the tests need (only if missing) and run every test, real-server tests
# included. Real-server test binaries start servers per test, so test threads are capped.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-test-deps.sh
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# No crate may need protoc to build: prost-build (the usual way a crate does) honours
# PROTOC, so pointing it at nothing makes any such build script fail here.
export PROTOC=/nonexistent/protoc
# The integration tests run the `tenure` binary as candidate processes.
cargo build --quiet -p tenure-cli
cargo test --workspace --all-features -- --test-threads="${TENURE_TEST_THREADS:-2}"
# Every publishable crate builds from its own packaged tarball (a missing file, a
# path outside the crate or a build-time tool shows here).
bash scripts/package-check.sh
