#!/usr/bin/env bash
# Copies the Fashion-MNIST idx files into .gpu/data/fashion-mnist/ of this checkout (ignored by
# git), so that they travel with the checkout to a machine without them; run.sh reads them
# from there. Source: $1, or Debian's dataset-fashion-mnist folder.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
source_dir=${1:-/usr/share/datasets/fashion-mnist}
target=$repo/.gpu/data/fashion-mnist
files=(train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz
       t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz)
for f in "${files[@]}"; do
  if [[ ! -f $source_dir/$f ]]; then
    echo "pack_data.sh: $source_dir/$f is missing (apt-get install dataset-fashion-mnist, or" \
         "give the folder holding the four idx .gz files)" >&2
    exit 1
  fi
done
if ! git -C "$repo" check-ignore -q "$target/${files[0]}" 2>/dev/null; then
  echo "pack_data.sh: warning: $target is not ignored by git; add '/.gpu/' to .gitignore" >&2
fi
mkdir -p "$target"
for f in "${files[@]}"; do
  cp -p "$source_dir/$f" "$target/$f"
  gzip -t "$target/$f"  # a damaged copy fails here, not on the GPU machine
done
du -sh "$target"
echo "Fashion-MNIST copied to $target"
