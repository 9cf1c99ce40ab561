#!/usr/bin/env bash
# The front door: sets up whatever is missing (scripts/setup.sh: Debian packages, guest
# kernel, images, farm itself; seconds when everything is in place), then runs the quickstart
# suite: five HumanEval-format tasks replayed from their reference solutions, scored in fresh
# forks. Its rows and summary go to out/quickstart/.
#
#   scripts/quickstart.sh        (on Debian 12, as root)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec target/release/farm run configs/quickstart.toml --out out/quickstart "$@"
