#!/usr/bin/env bash
# Fetches MovieLens-100k in RecBole's atomic files (ml-100k.inter, .user,
# .item) from the recbole 1.2.1 wheel on PyPI: `pip download --no-deps`, then
# only recbole/dataset_example/ml-100k/* is unpacked into the cache directory
# (default /var/cache/dtf-test/ml-100k; $1 or $DTF_ML100K to change it).
# A second run finds the files there and downloads nothing.
#
# Needs python3 with pip (the test venv's, or the system's) and the network
# to reach PyPI the first time.
set -euo pipefail
dest=${1:-${DTF_ML100K:-${DTF_TEST_CACHE:-/var/cache/dtf-test}/ml-100k}}
files=(ml-100k.inter ml-100k.user ml-100k.item)
have=yes
for f in "${files[@]}"; do [ -s "$dest/$f" ] || have=no; done
if [ "$have" = yes ]; then
    echo "ml-100k: cached in $dest"
    exit 0
fi
python=${PYTHON:-python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/ml100k.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$python" -m pip download -q --disable-pip-version-check --no-deps \
    --only-binary=:all: --dest "$work" 'recbole==1.2.1'
wheel=$(ls "$work"/recbole-1.2.1-*.whl)
# A wheel is a zip; Python's zipfile unpacks the three members alone (no
# unzip(1) needed on a fresh Debian).
"$python" - "$wheel" "$work/out" <<'PY'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
prefix = "recbole/dataset_example/ml-100k/"
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith(prefix) and not n.endswith("/")]
    if not names:
        sys.exit(f"{wheel}: no {prefix} in the wheel")
    for n in names:
        z.extract(n, out)
PY
mkdir -p "$dest"
for f in "${files[@]}"; do
    src="$work/out/recbole/dataset_example/ml-100k/$f"
    [ -s "$src" ] || { echo "ml-100k: $f is not in the recbole 1.2.1 wheel" >&2; exit 1; }
    # Temp then rename: an interrupted run never leaves a half file that a
    # later run would take as cached.
    cp "$src" "$dest/.$f.tmp"
    mv "$dest/.$f.tmp" "$dest/$f"
done
echo "ml-100k: fetched into $dest"
