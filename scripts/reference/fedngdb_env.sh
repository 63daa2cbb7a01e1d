#!/usr/bin/env bash
# A virtual environment for the authors' FedNGDB code (scripts/reference/reference_fedngdb.py --python):
# its own dependencies, kept out of ours. The CPU torch wheel first: an unpinned torch would
# pull gigabytes of CUDA packages.
#   bash scripts/reference/fedngdb_env.sh [DIR]      # default runs/fedngdb_venv; then --python DIR/bin/python
set -euo pipefail
dir="${1:-runs/fedngdb_venv}"
python3 -m venv "$dir"
"$dir/bin/python" -m pip install --quiet torch==2.13.0
"$dir/bin/python" -m pip install --quiet numpy pandas tqdm tensorboardX
echo "$dir/bin/python"
