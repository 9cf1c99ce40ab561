#!/usr/bin/env bash
# The front door: sets up whatever the quickstart needs and is missing (scripts/setup.sh
# --quickstart: Debian packages, guest kernel, images, farm itself, built side by side; seconds
# when everything is in place; the test command's full set-up adds the rest), then runs the quickstart
# suite: five HumanEval-format tasks replayed from their reference solutions, scored in fresh
# forks. Its rows and summary go to out/quickstart/.
#
#   scripts/quickstart.sh        (on Debian 12, as root)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --quickstart
exec target/release/farm run configs/quickstart.toml --out out/quickstart "$@"
