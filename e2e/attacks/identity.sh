#!/usr/bin/env bash
# Issue 27's review, replayed against one `pinion` binary: what a person with
# credentials, a pod, a deleted node and a join token can reach. Run as root
# on a host with two CPUs; everything lives in a temp dir and on loopback.
#
#   bash e2e/attacks/identity.sh PINION
#
# With a binary that has `pinion user`, the pod attacks are made by a
# baseline user (alice, uid 1001); with an older one, by the only identity
# there is (everyone held the admin's certificate). Each line: the attack,
# then what happened.
set -u
PINION=$(realpath "${1:?usage: identity.sh PINION}")
PORT=${PORT:-7643}
TMP=$(mktemp -d /tmp/pinion-attacks.XXXXXX)
DATA=$TMP/data
LOG=$TMP/up.log
cleanup() {
    [ -n "${UP:-}" ] && kill "$UP" 2>/dev/null && wait "$UP" 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT

export PINION_CONFIG=$TMP/admin.conf
"$PINION" up --listen 127.0.0.1:$PORT --local-listen off --data-dir "$DATA" \
    --cni-conf-dir "$TMP/cni" >"$LOG" 2>&1 &
UP=$!
for _ in $(seq 1 100); do grep -q "pinion is up" "$LOG" && break; sleep 0.2; done
grep -q "pinion is up" "$LOG" || { echo "pinion up did not come up:"; cat "$LOG"; exit 1; }
for _ in $(seq 1 100); do "$PINION" get nodes 2>/dev/null | grep -q Ready && break; sleep 0.2; done

say() { printf '%-58s %s\n' "$1" "$2"; }
# The first line of a command's output and its exit code.
outcome() { local out; out=$(timeout 60 "$@" 2>&1); echo "exit $?: $(echo "$out" | tr '\n' ' ' | cut -c1-150)"; }

if "$PINION" user --help >/dev/null 2>&1; then
    WHO="user alice (baseline)"
    "$PINION" user add alice --uid 1001 --gid 1001 --out "$TMP/alice.conf" >/dev/null || exit 1
    AS=(--config "$TMP/alice.conf")
else
    WHO="the admin's certificate (the only identity)"
    AS=()
fi
echo "pods submitted as $WHO"
say "1. --cap-add DAC_READ_SEARCH" \
    "$(outcome "$PINION" "${AS[@]}" run a1 --cap-add DAC_READ_SEARCH -- sh -c 'grep CapEff /proc/self/status')"
say "2. --cap-add SYS_ADMIN, remount /etc read-write" \
    "$(outcome "$PINION" "${AS[@]}" run a2 --cap-add SYS_ADMIN -- sh -c 'mount -o remount,rw,bind /etc && echo REMOUNTED-RW; mount -o remount,ro,bind /etc')"
say "3. default host-rootfs pod reads /etc/shadow" \
    "$(outcome "$PINION" "${AS[@]}" run a3 -- sh -c 'id -u; head -c 5 /etc/shadow >/dev/null && echo SHADOW-READ')"
say "4. hostPath / read-write" \
    "$(outcome "$PINION" "${AS[@]}" run a4 -v /:/host -- sh -c 'test -w /host/etc && echo HOST-ROOT-WRITABLE')"

# The node's certificate: how long it lives.
NODECONF=$DATA/node/node.conf
pem() { python3 -c "import sys,yaml; print(yaml.safe_load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"; }
pem "$NODECONF" clientCert >"$TMP/node.crt"
pem "$NODECONF" clientKey >"$TMP/node.key"
pem "$NODECONF" caCert >"$TMP/ca.crt"
say "5. the node's certificate is valid" \
    "$(openssl x509 -in "$TMP/node.crt" -noout -startdate -enddate | tr '\n' ' ')"

# A deleted node's certificate, used again.
NODE=$(openssl x509 -in "$TMP/node.crt" -noout -subject | sed -n 's/.*CN *= *node:\([^,/]*\).*/\1/p')
NODEJSON=$("$PINION" get nodes "$NODE" -o json)
# The pods go first, while the agent can still remove their containers.
"$PINION" delete pod a1 a2 a3 a4 >/dev/null 2>&1
for _ in $(seq 1 100); do [ -z "$(ls -A "$DATA/node/containers" 2>/dev/null)" ] && break; sleep 0.2; done
kill "$UP"; wait "$UP" 2>/dev/null; UP=
# The agent is gone; the server alone answers for the node from here.
"$PINION" server --listen 127.0.0.1:$PORT --data-dir "$DATA/server" >>"$LOG" 2>&1 &
UP=$!
for _ in $(seq 1 100); do "$PINION" get nodes >/dev/null 2>&1 && break; sleep 0.2; done
"$PINION" delete node "$NODE" >/dev/null
curl_node() {
    curl -s -o /dev/null -w '%{http_code}' --cacert "$TMP/ca.crt" --cert "$TMP/node.crt" --key "$TMP/node.key" \
        -H 'content-type: application/json' "$@"
}
say "6a. the deleted node registers again with its old certificate" \
    "HTTP $(curl_node -X POST --data "$NODEJSON" https://127.0.0.1:$PORT/api/v1/nodes)"
say "6b. ... and heartbeats" \
    "HTTP $(curl_node -X POST https://127.0.0.1:$PORT/api/v1/nodes/$NODE/heartbeat)"

# The join token: reused, and by a rogue machine claiming 512 CPUs.
TOKEN=$(cat "$DATA/server/join-token")
join() {
    curl -s -o /dev/null -w '%{http_code}' --cacert "$TMP/ca.crt" -H "authorization: Bearer $1" \
        -H 'content-type: application/json' --data "{\"nodeName\":\"$2\"}" https://127.0.0.1:$PORT/api/v1/join
}
say "7a. the bootstrap token joins a machine" "HTTP $(join "$TOKEN" rogue-1)"
say "7b. ... and another" "HTTP $(join "$TOKEN" rogue-2)"
if "$PINION" token --help >/dev/null 2>&1; then
    ONCE=$("$PINION" token create --uses 1 --ttl 1h 2>/dev/null | grep -Eo '[0-9a-f]{64}\.[A-Za-z0-9_.-]+' | head -1)
    say "7c. a single-use token, twice" "HTTP $(join "$ONCE" rogue-3) then HTTP $(join "$ONCE" rogue-4)"
    "$PINION" token revoke bootstrap >/dev/null
    say "7d. the bootstrap token after 'pinion token revoke bootstrap'" "HTTP $(join "$TOKEN" rogue-5)"
else
    say "7c. a command to change or revoke the token" "none ('pinion token' does not exist)"
fi
