#!/usr/bin/env bash
# Installs the build into a temporary prefix, builds tests/install against find_package(kvouter)
# and runs it. usage: install_test.sh BUILD_DIR CMAKE NINJA
set -euo pipefail
build=$(readlink -f "$1") cmake=$(readlink -f "$2") ninja=$(readlink -f "$3")
src=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$cmake" --install "$build" --prefix "$tmp/prefix" > "$tmp/install.log"
"$cmake" -S "$src" -B "$tmp/build" -G Ninja -DCMAKE_MAKE_PROGRAM="$ninja" \
  -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_BUILD_TYPE=Release > "$tmp/configure.log"
"$cmake" --build "$tmp/build" > "$tmp/build.log"
if ldd "$tmp/build/consumer" | grep -q libHalide; then echo "consumer links libHalide"; exit 1; fi
"$tmp/build/consumer"
