#!/usr/bin/env bash
# Installs lowbit's build and test dependencies from Debian's packages.
# Idempotent: packages already present are left alone and apt is not touched at all.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git python3 python3-pip
  nlohmann-json3-dev libssl-dev libcli11-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev libhwy-dev
  libpcre2-dev libsentencepiece-dev libicu-dev libcpp-httplib-dev
  clang libclang-rt-14-dev clang-format jq
  zlib1g-dev
  # lowbit transcribe: WAV and FLAC input (libsndfile) resampled to the model's rate (libsoxr)
  libsndfile1-dev libsoxr-dev
  # quantization's Cholesky, triangular inverses and Hessian products (src/quant/linalg.cpp)
  libopenblas-dev liblapacke-dev
  # the lowbit Python package (python/): its extension module and the pytest suite ctest runs
  pybind11-dev python3-dev python3-pytest
  # lowbit quantize's default calibration text: /usr/share/debian-reference/debian-reference.en.txt.gz
  debian-reference-en
  # scripts/plot_kld_bpw.py (run with /usr/bin/python3): the KLD-against-bits plot of scripts/compare_llamacpp.sh
  python3-matplotlib
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "[install-deps] installing: ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
