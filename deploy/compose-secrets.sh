#!/bin/sh
# Run once by compose.yaml's relay-secrets service, as root, before the replicas start: turns the
# compose secrets into the files relay-server reads, owned by the image's user and readable by it
# alone (a bind-mounted secret keeps its owner and mode from the host, which that user may not
# read). SECRETS, OUT and OWNER are for running it elsewhere.
#   db-password       -> database-url: a key=value string, so any character in the password works
#   tls.crt, tls.key  -> tls.crt, tls.key
set -eu
secrets=${SECRETS:-/run/secrets}
out=${OUT:-/run/relay}
owner=${OWNER:-10001:10001}
umask 077

# Trailing newlines go, as the Postgres image drops them from POSTGRES_PASSWORD_FILE.
password=$(cat "$secrets/db-password")
# Inside a quoted value only backslash and quote are special: each gets a backslash.
quoted=$(printf '%s' "$password" | sed "s/[\\\\']/\\\\&/g")
tmp=$(mktemp)
printf "host=postgres port=5432 user=relay dbname=relay password='%s'\n" "$quoted" > "$tmp"

put() {
  install -m 0400 -o "${owner%%:*}" -g "${owner#*:}" "$1" "$out/$2"
}
put "$tmp" database-url
rm -f "$tmp"
put "$secrets/tls.crt" tls.crt
put "$secrets/tls.key" tls.key
