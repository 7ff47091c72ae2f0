#!/usr/bin/env bash
# Build the raygpu sidecar image from this checkout, tagged by the scheme
# <raygpu version>-ray<Ray version>, both read from pyproject.toml ([project]
# version, and the Ray CI tests: the test extra's "ray[default]==<version>" pin,
# inside the range the ray extra accepts), e.g. raygpu:0.1.0-ray2.60.0. The same
# source always gives the same tag.
#
#   deploy/image/build.sh               build $IMAGE:<tag>
#   deploy/image/build.sh --push        build, then push $IMAGE:<tag>
#   deploy/image/build.sh --print-tag   print the tag only (no container engine needed)
#
# IMAGE: repository to tag (default "raygpu"; e.g. ghcr.io/my-org/raygpu).
# ENGINE: podman or docker (default: the first found). Run from anywhere.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
py="$root/pyproject.toml"
raygpu_version=$(sed -n 's/^version = "\([^"]*\)"$/\1/p' "$py" | head -1)
ray_version=$(sed -n 's/^ *"ray\[default\]==\([0-9][0-9.]*\)",.*$/\1/p' "$py")
if [ -z "$raygpu_version" ] || [ -z "$ray_version" ] || [ "$(printf '%s\n' "$ray_version" | wc -l)" != 1 ]; then
  echo "build.sh: cannot read the raygpu version or the test extra's one \"ray[default]==X\" pin from $py" >&2
  exit 2
fi
tag="$raygpu_version-ray$ray_version"
case "${1:-}" in
  --print-tag) echo "$tag"; exit 0 ;;
  --push|"") ;;
  *) echo "usage: $0 [--push | --print-tag]" >&2; exit 2 ;;
esac
engine="${ENGINE:-$(command -v podman || command -v docker || true)}"
[ -n "$engine" ] || { echo "build.sh: no podman or docker found (set ENGINE)" >&2; exit 2; }
image="${IMAGE:-raygpu}:$tag"
revision=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
"$engine" build -f "$root/deploy/image/Containerfile" \
  --build-arg RAY_VERSION="$ray_version" --build-arg RAYGPU_VERSION="$raygpu_version" \
  --build-arg REVISION="$revision" -t "$image" "$root"
echo "built $image"
if [ "${1:-}" = --push ]; then "$engine" push "$image"; echo "pushed $image"; fi
