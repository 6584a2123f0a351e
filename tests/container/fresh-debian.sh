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
# A signal ends the script through its exit, so the cleanup runs then too.
trap 'exit 130' INT TERM HUP
mkdir -p "$work/src" "$work/containers"
git archive --format=tar HEAD | tar -C "$work/src" -x
echo "fresh Debian check: $(git rev-parse --short HEAD) in $name, from $base, Rust $(rustc --version | cut -d' ' -f2)" >&2
# The nested engine keeps its images on a volume: overlay cannot stack on the container's overlay.
# The engine's default limits are more than a runtime may set without CAP_SYS_RESOURCE: ask for
# this shell's open files and ample processes.
files="$(ulimit -Hn)" processes=32768
# The machine's network goes in as a machine on it has it: its own certificate authorities (an
# egress proxy's, say), which Debian's ca-certificates adds to the system bundle when ./test installs
# it, and the variables that point npm, pip and git at that bundle.
network=()
if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
  network+=(-v /usr/local/share/ca-certificates:/usr/local/share/ca-certificates:ro)
fi
for var in SSL_CERT_FILE NODE_EXTRA_CA_CERTS PIP_CERT REQUESTS_CA_BUNDLE GIT_SSL_CAINFO CURL_CA_BUNDLE \
  http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
  [[ -n ${!var:-} ]] && network+=(-e "$var")
done
"$engine" run --rm --name "$name" --privileged "${network[@]}" \
  --ulimit "nofile=$files:$files" --ulimit "nproc=$processes:$processes" \
  -v "$toolchain:/opt/rust:ro" \
  -v "$work/src:/src" \
  -v "$work/containers:/var/lib/containers" \
  -e PATH=/opt/rust/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  -w /src \
  "$base" bash -c './test --provision && ./test'
