#!/usr/bin/env bash
# scripts/demo after scripts/test: the demo builds only what it runs, in the
# build that is there, as that build was configured. Run by ctest on the build
# it has just tested, which is up to date: bringing the demo's targets up to
# date must be no work at all, and must leave the configuration (a
# profile-guided one, say) as it was.
#   demo_build_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
source_dir=$1
build_dir=$2

grep -q -- '--reuse --target sluice --target sluice-mock' "$source_dir/scripts/demo" || {
  echo "scripts/demo does not build only sluice and sluice-mock in the build that is there"
  exit 1
}
configuration() { grep -E '^(SLUICE_PGO|SLUICE_LTO|SLUICE_SANITIZE|CMAKE_BUILD_TYPE):' "$build_dir/CMakeCache.txt"; }
before=$(configuration)
output=$(SLUICE_BUILD_DIR=$build_dir "$source_dir/scripts/build" --reuse --target sluice --target sluice-mock 2>&1)
after=$(configuration)
if [ "$before" != "$after" ]; then
  printf 'the configuration changed:\n%s\n---\n%s\n' "$before" "$after"
  exit 1
fi
if ! grep -q 'no work to do' <<<"$output"; then
  printf 'building the demo rebuilt something:\n%s\n' "$output"
  exit 1
fi
echo "the demo's build reused the one that was there"
