#!/usr/bin/env bash
# Runs clang-tidy (.clang-tidy: bug patterns and needless copies, as errors) on the C++ sources changed since BASE
# (default: the merge base with main, else the previous commit), with the flags of BUILD_DIR's
# compile_commands.json (default build/cuda, which `./run test` configures). Only changed files are checked: the
# tree predates the file. Exits 1 on a finding.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-}
build=${2:-build/cuda}
if [ -z "$base" ]; then
  base=$(git merge-base HEAD main 2>/dev/null || git rev-parse --verify -q HEAD~1 || true)
fi
if [ -z "$base" ] || [ "$(git rev-parse HEAD)" = "$(git rev-parse "$base")" ]; then
  echo "[tidy] no earlier commit to compare with; nothing to check" >&2
  exit 0
fi
[ -f "$build/compile_commands.json" ] || { echo "[tidy] $build/compile_commands.json: absent (configure first)" >&2; exit 1; }
mapfile -t files < <(git diff --name-only --diff-filter=AM "$base" -- 'src/*.cpp' 'tests/*.cpp' 'fuzz/*.cpp' 'bench/*.cpp')
[ ${#files[@]} -eq 0 ] && { echo "[tidy] no C++ source changed since $base" >&2; exit 0; }
status=0
for f in "${files[@]}"; do
  grep -q "\"file\": \"[^\"]*/$f\"" "$build/compile_commands.json" || continue  # not in this build (e.g. CUDA-only)
  # GCC's -Werror=<warning> flags in the build are unknown to clang: not findings.
  out=$(clang-tidy -p "$build" --quiet --extra-arg=-Wno-unknown-warning-option "$f" 2>/dev/null || true)
  if grep -E "(error|warning):" <<<"$out"; then status=1; fi
done
[ $status -eq 0 ] && echo "[tidy] ${#files[@]} changed sources since $base pass .clang-tidy" >&2
[ $status -eq 0 ] || echo "[tidy] findings above in sources changed since $base" >&2
exit $status
