#!/usr/bin/env bash
# Prints the first Python 3.9-3.11 interpreter on PATH (dm-reverb 0.14 ships
# wheels for those versions only), or exits 1 with a one-line error.
for candidate in python3.11 python3.10 python3.9 python3 python; do
  if command -v "$candidate" >/dev/null 2>&1 &&
     "$candidate" -c 'import sys; sys.exit(not (3, 9) <= sys.version_info[:2] <= (3, 11))' 2>/dev/null; then
    command -v "$candidate"
    exit 0
  fi
done
echo "error: no Python 3.9, 3.10 or 3.11 found on PATH (dm-reverb 0.14 has wheels only for those); install one, e.g. 'pyenv install 3.11'." >&2
exit 1
