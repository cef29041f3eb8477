#!/usr/bin/env bash
# Cuts a release of every module, checks the API against the last release,
# or verifies tags as a user's go command sees them (docs/releasing.md).
#   scripts/release.sh tag -version v0.1.0 -dry-run
#   scripts/release.sh tag -version v0.1.0
#   scripts/release.sh verify -version v0.1.0
#   scripts/release.sh apicheck
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo/internal/release"
GOWORK=off go build -o "${TMPDIR:-/tmp}/cidroute-release" .
exec "${TMPDIR:-/tmp}/cidroute-release" -repo "$repo" "$@"
