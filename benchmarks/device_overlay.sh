#!/usr/bin/env bash
# What the service needs beyond a lent GPU machine's image, as one archive a call can carry:
#
#   bash benchmarks/device_overlay.sh [PYTHON_VERSION]     # default 3.12, the GPU image's python3
#
# The GPU machines reach no package registry and a call carries at most 64 MiB, so their runs went
# without Ray, Optuna and MLflow (the trainables need none of them). This builds
# .device/overlay.tar.xz (about 45 MB for Python 3.12): the wheels of pyproject.toml's dependencies
# for that Python on x86-64 Linux, less torch and the packages the image already holds
# (DEVICE_HAS, from /work/.library/device/KINDS.md, read 2026-11-17), installed into one folder
# that goes on PYTHONPATH there, less what a headless run never loads (Ray's Java jars, RLlib and
# its dashboard's web page, MLflow's web page). benchmarks/gpu_launch.sh unpacks it on the GPU
# machine; a call carries it with `carry: [".device"]`.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-3.12}
py=${PYTHON:-python3}
DEVICE_HAS="absl_py aiohappyeyeballs aiohttp aiosignal annotated_doc anyio attrs certifi charset_normalizer click
cloudpickle contourpy cycler filelock fonttools frozenlist fsspec h11 idna jinja2 joblib kiwisolver markupsafe matplotlib
mpmath msgpack multidict narwhals numpy packaging pandas pillow propcache protobuf pyarrow pyparsing python_dateutil pyyaml
requests scikit_learn scipy six sympy threadpoolctl torch tqdm typing_extensions urllib3 werkzeug yarl zipp"
target=(--python-version "$version" --implementation cp --only-binary=:all:
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$py" -c 'import tomllib; print("\n".join(d for d in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"] if not d.startswith("torch")))' \
    > "$work/requirements.txt"
"$py" -m pip download -q "${target[@]}" -d "$work/wheels" -r "$work/requirements.txt"
needed=()
for wheel in "$work"/wheels/*.whl; do
    name=$(basename "$wheel" | sed -E 's/-[0-9].*//' | tr 'A-Z-.' 'a-z__')
    [[ " $(echo $DEVICE_HAS) " == *" $name "* ]] || needed+=("$wheel")
done
"$py" -m pip install -q --no-deps --no-compile "${target[@]}" --target "$work/overlay" "${needed[@]}"
rm -rf "$work/overlay"/{ray/jars,ray/rllib,ray/dashboard/client/build,mlflow/server/js/build,bin}
mkdir -p .device
tar -cf - -C "$work/overlay" . | xz -T0 -6 > .device/overlay.tar.xz
echo "$(du -h .device/overlay.tar.xz | cut -f1) .device/overlay.tar.xz: ${#needed[@]} packages for Python $version:" \
     "$(for w in "${needed[@]}"; do basename "$w" | sed -E 's/-[0-9].*//'; done | tr '\n' ' ')"
