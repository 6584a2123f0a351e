#!/usr/bin/env bash
# Builds the local Debian 12 base image the container tests start from, when it is not there yet:
# no image registry is assumed reachable, so the root file system comes from Debian's own mirror
# through debootstrap. Prints the image's name. Usage: tests/container/debian-base.sh [ENGINE]
set -euo pipefail
engine="${1:-podman}"
image="localhost/relay-debian:bookworm"
if "$engine" image exists "$image" 2>/dev/null || "$engine" image inspect "$image" >/dev/null 2>&1; then
  echo "$image"
  exit 0
fi
mirror="${RELAY_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
root="$(mktemp -d /var/tmp/relay-debian-root.XXXXXX)"
trap 'rm -rf "$root" "$root.log"' EXIT
echo "building $image from $mirror with debootstrap (a few minutes, once)" >&2
debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.log" 2>&1 || { tail -n 30 "$root.log" >&2; exit 1; }
rm -f "$root.log"
# The image's apt reads the same mirror, and its package lists are fetched when something is installed.
echo "deb $mirror bookworm main" >"$root/etc/apt/sources.list"
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb
tar -C "$root" -c . | "$engine" import --change 'CMD ["/bin/bash"]' - "$image" >/dev/null
echo "$image"
