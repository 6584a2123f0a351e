#!/usr/bin/env bash
# Builds the relay-server image from deploy/Dockerfile where no registry is reachable: the runtime
# base is the local Debian image (debian-base.sh), the build stage a local stand-in for the official
# Rust image (rust-builder.Containerfile) running this machine's toolchain. The Dockerfile itself is
# used as it ships. Prints the image's name; the build's own output goes to stderr.
# Needs podman (docker's build cannot mount the toolchain). Usage: tests/container/server-image.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
base="$(tests/container/debian-base.sh podman)"
builder="localhost/relay-rust-builder:bookworm"
image="localhost/relay-server:test"
# The builder trusts what this machine trusts beyond Debian's roots (an egress proxy's authority,
# say), to fetch crates.
local_cas=()
if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
  local_cas=(-v /usr/local/share/ca-certificates:/usr/local/share/ca-certificates:ro)
fi
podman build -q --network host -t "$builder" --build-arg BASE="$base" "${local_cas[@]}" \
  -f tests/container/rust-builder.Containerfile tests/container >/dev/null
# --format docker: an OCI image (podman's default) drops the HEALTHCHECK. The host's network, as
# an engine inside a container may have none of its own that reaches the registries.
podman build --format docker --network host -t "$image" -f deploy/Dockerfile \
  --build-arg RUST_IMAGE="$builder" --build-arg RUNTIME_IMAGE="$base" \
  -v "$(rustc --print sysroot):/opt/rust:ro" . >&2
echo "$image"
