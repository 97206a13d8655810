#!/usr/bin/env bash
# Every #include of a sluice header follows the direction the stage libraries
# link in (src/CMakeLists.txt): a stage includes itself and the stages below
# it, never one above it.
#   stage_dependencies_test.sh SOURCE_DIR STAGE:BELOW,BELOW... ...
set -euo pipefail
source_dir=$1
shift
cd "$source_dir"
# Every include as "stage included file:line", the stage being the folder
# the including file lies in.
includes=$(grep -rnoE '^#include "sluice/[a-z_]+/' src include/sluice |
  sed -E 's#^(src|include/sluice)/([a-z_]+)/([^:]*):([0-9]+):\#include "sluice/([a-z_]+)/$#\2 \5 \1/\2/\3:\4#')
stages=$(ls -d src/*/ include/sluice/*/ | xargs -n1 basename | sort -u)
printf '%s\n' "$@" | awk -v stages="$stages" -v includes="$includes" '
  { split($0, parts, ":"); allowed[parts[1]] = "," parts[2] "," }
  END {
    violations = 0
    n = split(stages, folders, "\n")
    for (i = 1; i <= n; i++) {
      if (folders[i] == "app" || folders[i] in allowed) continue
      print folders[i] ": a stage that src/CMakeLists.txt does not declare"
      violations++
    }
    n = split(includes, lines, "\n")
    for (i = 1; i <= n; i++) {
      split(lines[i], f, " ")
      if (f[1] == "app" || f[1] == f[2] || !(f[1] in allowed)) continue
      if (index(allowed[f[1]], "," f[2] ",") == 0) {
        print f[3] ": " f[1] " includes " f[2] ", which is not below it"
        violations++
      }
    }
    if (violations > 0) {
      print violations " include(s) against the direction of the stages"
      exit 1
    }
    print "every include follows the direction of the stages"
  }'
