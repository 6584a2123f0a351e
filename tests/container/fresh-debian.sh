#!/usr/bin/env bash
# Runs the README's set-up and test commands on a fresh Debian 12 that has nothing but a Rust
# toolchain: a container from the local base image (debian-base.sh), this machine's toolchain
# mounted read-only, and the committed tree (git archive HEAD) as a new contributor's checkout.
# Privileged, as the suite starts network namespaces and a Postgres container of its own.
#
# Slow (a cold build and every test: most of an hour on two cores), so not part of every CI run.
# Needs root and podman. Usage: tests/container/fresh-debian.sh   (exit status: the tests')
set -euo pipefail
cd "$(dirname "$0")/../.."
engine=podman
base="$(tests/container/debian-base.sh "$engine")"
toolchain="$(rustc --print sysroot)"
work="$(mktemp -d /var/tmp/relay-fresh.XXXXXX)"
name="relay-fresh-debian-$$"
cleanup() {
  "$engine" rm -f -t 0 "$name" >/dev/null 2>&1 || true
  # The nested engine's storage may hold files owned by other ids; it goes with the rest.
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/src" "$work/containers"
git archive --format=tar HEAD | tar -C "$work/src" -x
echo "fresh Debian check: $(git rev-parse --short HEAD) in $name, from $base, Rust $(rustc --version | cut -d' ' -f2)" >&2
# The nested engine keeps its images on a volume: overlay cannot stack on the container's overlay.
# The engine's default limits are more than a runtime may set without CAP_SYS_RESOURCE: ask for
# this shell's open files and ample processes.
files="$(ulimit -Hn)" processes=32768
"$engine" run --rm --name "$name" --privileged \
  --ulimit "nofile=$files:$files" --ulimit "nproc=$processes:$processes" \
  -v "$toolchain:/opt/rust:ro" \
  -v "$work/src:/src" \
  -v "$work/containers:/var/lib/containers" \
  -e PATH=/opt/rust/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  -w /src \
  "$base" bash -c './test --provision && ./test'
