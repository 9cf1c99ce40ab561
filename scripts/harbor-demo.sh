#!/usr/bin/env bash
# Runs a Harbor suite (default configs/harbor.toml) with the local services it needs:
# scripts/harbor-services.sh on ports 15000-15002 (the registry with the tasks' base image,
# the package index, the Debian repository), configs/harbor-registries.toml as the host's
# registry settings, and the services stopped afterwards. Sets up whatever is missing first.
#
#   scripts/harbor-demo.sh [SUITE.toml] [farm run flags...]
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SUITE="${1:-$REPO/configs/harbor.toml}"
shift || true
bash "$REPO/scripts/setup.sh"
services="$REPO/out/harbor-services"
trap 'bash "$REPO/scripts/harbor-services.sh" stop "$services"' EXIT
bash "$REPO/scripts/harbor-services.sh" start "$services" 15000 15001 15002 >/dev/null
FARM_REGISTRIES="$REPO/configs/harbor-registries.toml" HARBOR_PIP_INDEX="http://host.farm.internal:15001/simple" \
  "$REPO/target/release/farm" run "$SUITE" "$@"
