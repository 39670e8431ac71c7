#!/usr/bin/env bash
# The README's demo: installs what is needed, builds, writes a small distributed checkpoint
# (8 source ranks of a transformer-like model), mounts it resharded to 4 ranks, shows the
# tree and one synthesized file, checks every file against a conversion made by
# construction, and unmounts.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --demo >/dev/null
# Only the ckptfs binary, in its own directory (build/ stays the test suite's), as a unity build:
# batching the sources halves the compiler's work, and the demo does not need the tests or
# benchmarks. Progress stays visible.
echo "building ckptfs (the binary only, into build-demo/)..."
build_demo() {  # extra cmake options
  cmake -S . -B build-demo -DCMAKE_BUILD_TYPE=Release -DCKPTFS_BUILD_TESTS=OFF \
    -DCKPTFS_BUILD_BENCH=OFF "$@" >/dev/null
  cmake --build build-demo -j"$(nproc)" --target ckptfs 2>&1 |
    grep --line-buffered -E '^\[ *[0-9]+%\]|error' |
    sed -u -E 's/^\[ *([0-9]+)%\].*/  build \1%/' | uniq
}
if ! build_demo -DCMAKE_UNITY_BUILD=ON; then
  echo "the unity build failed (two sources of a module share a file-local name); building the usual way"
  build_demo -DCMAKE_UNITY_BUILD=OFF
fi

work=${CKPTFS_DEMO_DIR:-$(mktemp -d /tmp/ckptfs-demo.XXXXXX)}
sample=$work/sample
mnt=$work/mnt
ckptfs=$PWD/build-demo/ckptfs
rm -rf "$sample" "$mnt"
mkdir -p "$mnt"

say() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }

say "scripts/ckpt_fixture.py make --builtin demo $sample"
/usr/bin/python3 scripts/ckpt_fixture.py make --builtin demo "$sample"

say "ls -l $sample/src/rank_*    # 8 source ranks, one slice of every parameter each"
ls -l "$sample"/src/rank_0 "$sample"/src/rank_7

say "ckptfs ranks 0 --src-strategy src_strategy.ckpt --dst-strategy dst_strategy.ckpt"
"$ckptfs" ranks 0 --src-strategy "$sample/src_strategy.ckpt" \
  --dst-strategy "$sample/dst_strategy.ckpt"

say "ckptfs mount $sample/src $mnt --src-strategy ... --dst-strategy ..."
"$ckptfs" mount "$sample/src" "$mnt" --src-strategy "$sample/src_strategy.ckpt" \
  --dst-strategy "$sample/dst_strategy.ckpt" --index-dir "$work/index" \
  --log-file "$work/ckptfs.log"
trap '"$ckptfs" umount "$mnt" 2>/dev/null || true' EXIT

say "ls -lR $mnt    # sizes are exact before any byte is read"
ls -lR "$mnt"

say "ckptfs inspect $mnt/rank_0/checkpoint_0.ckpt"
"$ckptfs" inspect "$mnt/rank_0/checkpoint_0.ckpt"

say "protoc --decode_raw < $mnt/rank_0/checkpoint_0.ckpt | head"
protoc --decode_raw <"$mnt/rank_0/checkpoint_0.ckpt" >"$work/decoded.txt"
head -12 "$work/decoded.txt" | cut -c1-100

say "cmp every mounted file with the conversion the fixture generator made by construction"
for f in "$sample"/expected/rank_*/*.ckpt; do
  rel=${f#"$sample"/expected/}
  cmp "$f" "$mnt/$rel" && echo "identical: $rel ($(stat -c %s "$f") bytes)"
done

say "ckptfs umount $mnt"
"$ckptfs" umount "$mnt"
trap - EXIT
echo "done; sample and index left in $work"
