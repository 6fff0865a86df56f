#!/usr/bin/env bash
# Runs Schemathesis against a running Pinion server, with the flags the e2e
# test (e2e/tests/schemathesis.rs) and the longer run by hand share.
#
#   run.sh SCHEMATHESIS URL CREDENTIALS_DIR MAX_EXAMPLES [extra schemathesis flags...]
#
# CREDENTIALS_DIR holds ca.pem, cert.pem and key.pem (the admin identity) and
# join-token; without cert.pem the run is anonymous. Every check runs except positive_data_acceptance: the schema
# cannot say everything validation refuses (a container needs an image or
# rootfs, limits >= requests, ...), and those 422s name their field, which the
# `field_named` check in hooks.py holds them to. The attach stream is left
# out (it ends only with its pod); hooks.py turns `watch` and `follow` off.
# Exits non-zero on any finding.
set -euo pipefail
st=$1 url=$2 creds=$3 examples=$4
shift 4
here=$(cd "$(dirname "$0")" && pwd)
spec=$here/../../orchestrator/openapi.yaml
export SCHEMATHESIS_HOOKS=$here/hooks.py
# Without cert.pem the requests carry no certificate: the anonymous pass,
# where hooks.py holds every route but the public ones to a 401.
identity=()
if [ -f "$creds/cert.pem" ]; then
  identity=(--request-cert "$creds/cert.pem" --request-cert-key "$creds/key.pem")
else
  export PINION_SCHEMATHESIS_ANONYMOUS=1
fi
exec "$st" run "$spec" \
  --url "$url" \
  --tls-verify "$creds/ca.pem" \
  "${identity[@]}" \
  --header "Authorization: Bearer $(cat "$creds/join-token")" \
  --checks all \
  --exclude-checks positive_data_acceptance \
  --exclude-operation-id attachPod \
  --max-examples "$examples" \
  --request-timeout 30 \
  --workers 1 \
  --no-color \
  --generation-database none \
  "$@"
