#!/usr/bin/env bash
# The export's RoPE and architecture tests under each transformers release the pin allows (not in CI:
# one fresh venv per version). usage: bench/pin_matrix.sh [VERSION ...]   (default: one release of each minor the pin allows)
# Prints one line per version: the version and pytest's summary.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
versions=${*:-5.15.0 5.16.1 5.17.0}
for v in $versions; do
  env=/tmp/blockdraft-pin-$v
  [[ -d $env ]] || python3 -m venv "$env"
  "$env/bin/pip" install -q torch==2.13.0 "transformers==$v" safetensors tokenizers numpy pydantic pyyaml rich \
    orjson msgspec pytest >/dev/null 2>&1 || { echo "transformers $v: install failed"; continue; }
  "$env/bin/pip" install -q --no-deps -e "$here" >/dev/null 2>&1
  summary=$(cd "$here" && "$env/bin/python" -m pytest -q -p no:cacheprovider tests/model/test_rope_export.py \
    tests/model/test_export.py tests/model/test_architectures.py 2>&1 | tail -1)
  echo "transformers $v: $summary"
done
