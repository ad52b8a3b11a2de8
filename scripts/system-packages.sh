#!/usr/bin/env bash
# Install the Debian packages listed in system-packages.txt that are missing.
# Idempotent: when everything is installed it only asks dpkg, which is quick.
set -euo pipefail
cd "$(dirname "$0")/.."
list=system-packages.txt
missing=()
while read -r pkg; do
  [[ -z "$pkg" || "$pkg" == \#* ]] && continue
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$pkg")
done < "$list"
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "error: missing system packages (${missing[*]}) and no apt-get on this machine." >&2
  echo "fix: install their equivalents by hand; see $list for what each is for." >&2
  exit 1
fi
if [[ $(id -u) -ne 0 ]]; then
  SUDO=sudo
  command -v sudo >/dev/null 2>&1 || {
    echo "error: missing system packages: ${missing[*]}" >&2
    echo "fix: as root run: apt-get update && apt-get install -y ${missing[*]}" >&2
    exit 1
  }
else
  SUDO=
fi
echo "Installing system packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q >/dev/null
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
