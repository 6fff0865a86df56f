#!/usr/bin/env bash
# Installs the pinned Schemathesis into a virtual environment under the cargo
# target folder (cached: a second run only checks it) and prints the path of
# its `schemathesis` executable on the last line. Needs python3 with venv
# (Debian: python3-venv, which e2e/host-setup.sh installs) and PyPI.
set -euo pipefail
VERSION=4.32.5
repo=$(cd "$(dirname "$0")/../.." && pwd)
target=${CARGO_TARGET_DIR:-$repo/target}
venv=$target/schemathesis/venv-$VERSION
exe=$venv/bin/schemathesis
if [ -x "$exe" ] && "$exe" --version 2>/dev/null | grep -q "version $VERSION\$"; then
  echo "$exe"
  exit 0
fi
command -v python3 >/dev/null || { echo "setup.sh: python3 is missing" >&2; exit 1; }
rm -rf "$venv"
python3 -m venv "$venv" >&2 || { echo "setup.sh: python3 -m venv failed (Debian: apt-get install python3-venv)" >&2; exit 1; }
"$venv/bin/pip" install --quiet --disable-pip-version-check --timeout 60 "schemathesis==$VERSION" >&2
"$exe" --version >&2
echo "$exe"
