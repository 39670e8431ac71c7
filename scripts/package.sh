#!/usr/bin/env bash
# Builds the Debian package (CPack) and tests it: its files, its dependencies resolvable by apt
# on this Debian 12, and `ckptfs --version` run from the unpacked package. With --install it
# also installs it with apt-get, runs /usr/bin/ckptfs --version and the mount helper's link, and
# removes it again.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${CKPTFS_PACKAGE_BUILD:-build-package}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCKPTFS_BUILD_TESTS=OFF \
  -DCKPTFS_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" --target ckptfs manpage
(cd "$build" && cpack -G DEB >/dev/null)
deb=$(ls -t "$build"/ckptfs_*.deb | head -1)
echo "package: $deb"
dpkg-deb --info "$deb" | grep -E "Package|Version|Depends"
contents=$(dpkg-deb --contents "$deb")
for f in ./usr/bin/ckptfs ./usr/share/man/man1/ckptfs.1 ./sbin/mount.fuse.ckptfs ./sbin/mount.ckptfs; do
  grep -q " $f" <<<"$contents" || { echo "missing from the package: $f" >&2; exit 1; }
done
unpacked=$(mktemp -d)
trap 'rm -rf "$unpacked"' EXIT
dpkg-deb -x "$deb" "$unpacked"
"$unpacked/usr/bin/ckptfs" --version
apt-get install --simulate "./$deb" >/dev/null || apt-get install --simulate "$PWD/$deb" >/dev/null
echo "dependencies resolvable by apt"
if [[ ${1:-} == --install ]]; then
  apt-get install -y "$PWD/$deb" >/dev/null
  /usr/bin/ckptfs --version
  test "$(readlink /sbin/mount.fuse.ckptfs)" = /usr/bin/ckptfs
  apt-get remove -y ckptfs >/dev/null
  echo "installed, ran and removed"
fi
echo "package ok"
