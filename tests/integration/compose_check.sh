#!/usr/bin/env bash
# compose_check.sh — docker-compose.yml without a Docker engine: the file is valid for
# `docker-compose config` (Debian's docker-compose, installed by scripts/setup.sh), and what
# it would run exists in this build:
#   - every kvgw command's subcommand is one `kvgw --help` lists, and every --option it passes
#     is one `kvgw SUBCOMMAND --help` documents;
#   - every --config file exists and `kvgw check-config` accepts it (secrets from the same
#     environment variables docker-compose.yml passes), every --model file is one
#     scripts/models.sh writes;
#   - every build names docker/Dockerfile and a stage of it that exists, and the gateway and
#     worker stages have a HEALTHCHECK and run as a non-root user;
#   - every bind-mounted file or folder exists, Prometheus scrapes the gateway service's port,
#     the Grafana dashboard is valid JSON with the provisioned datasource's uid;
#   - the cluster profile: two gateways with distinct billing.instance_id and their own ledger
#     volumes, the registry on, the same secrets; `haproxy -c` accepts conf/haproxy.cfg (Debian's
#     haproxy, installed by scripts/setup.sh for the tests) and its servers are those gateways;
#     the Redis primary's and replica's command lines run on the real redis-server (noeviction,
#     append-only, the replica replicating, the gateways' password), the sentinels' command runs
#     the real redis-sentinel on conf/redis-sentinel.conf, which then watches that primary with
#     quorum 2 (host names and ports mapped to loopback); Prometheus scrapes both gateways.
#
#   KVGW_BIN=build/bin/kvgw tests/integration/compose_check.sh      (from the repository root)
# Exit status 0 when every check passed, 1 otherwise (each failure is printed).
set -uo pipefail

bin=${KVGW_BIN:-build/bin/kvgw}
compose=${KVGW_COMPOSE_FILE:-docker-compose.yml} # another file: to check the checker
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 1
fails=0
fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}
ok() { echo "ok   $*"; }

command -v docker-compose >/dev/null || { echo "FAIL: docker-compose is not installed (scripts/setup.sh)"; exit 1; }
[ -x "$bin" ] || { echo "FAIL: no kvgw binary at $bin"; exit 1; }

# The environment docker-compose.yml passes, so the file is read exactly as with the defaults.
cfg=$(env -u KVGW_API_KEY -u KVGW_ADMIN_KEY -u KVGW_LINK_SECRET -u KVGW_NAMESPACE_SECRET \
    docker-compose -f "$compose" config 2>&1) || {
    echo "$cfg"
    echo "FAIL: docker-compose config rejects docker-compose.yml"
    exit 1
}
ok "docker-compose config accepts docker-compose.yml"

# The normalized output, one record per line: "SERVICE<TAB>KEY<TAB>VALUE" for command items,
# build fields, volumes, environment and profiles.
records=$(awk '
    function flush() {
        if (item == "") return
        v = item; item = ""
        if (v ~ /^'\''.*'\''$/) { v = substr(v, 2, length(v) - 2); gsub(/'\'''\''/, "'\''", v) }
        else if (v ~ /^".*"$/) v = substr(v, 2, length(v) - 2)
        print isvc "\t" isect "\t" v
    }
    # A long list item continues on more-indented lines (a folded scalar: joined by a space).
    item != "" && /^      +[^ ]/ { l = $0; sub(/^ +/, "", l); item = item " " l; next }
    { flush() }
    /^services:/ { in_s = 1; next }
    /^[a-z]/ { in_s = 0 }
    !in_s { next }
    /^  [A-Za-z0-9_.-]+:$/ { svc = substr($1, 1, length($1) - 1); sect = ""; next }
    /^    [a-z_]+:/ {
        key = $1; sub(/:$/, "", key); sect = key
        if (key == "image") print svc "\timage\t" $2
        next
    }
    /^    - / && (sect == "command" || sect == "volumes" || sect == "profiles" || sect == "ports") {
        item = substr($0, 7); isvc = svc; isect = sect; next
    }
    /^      [a-z_]+:/ && sect == "build" {
        k = $1; sub(/:$/, "", k); v = $2; print svc "\tbuild." k "\t" v; next
    }
    /^      [A-Z_]+:/ && sect == "environment" {
        k = $1; sub(/:$/, "", k); v = $2; gsub(/^'\''|'\''$/, "", v); print svc "\tenv\t" k "=" v; next
    }
    END { flush() }
' <<<"$cfg")
services=$(cut -f1 <<<"$records" | sort -u)
for want in redis gateway prometheus grafana worker-cpu-1 worker-cpu-2 worker-gpu-1 worker-gpu-2 \
    redis-primary redis-replica sentinel-1 sentinel-2 sentinel-3 gateway-1 gateway-2 haproxy \
    prometheus-cluster; do
    grep -qx "$want" <<<"$services" || fail "no service $want"
done

subcommands=$("$bin" --help | awk '/^commands:/ { on = 1; next } on && /^  [a-z]/ { print $1 }')
[ -n "$subcommands" ] || fail "kvgw --help lists no commands"

# Each service's kvgw command.
for svc in $services; do
    mapfile -t argv < <(awk -F'\t' -v s="$svc" '$1 == s && $2 == "command" { print $3 }' <<<"$records")
    [ ${#argv[@]} -gt 0 ] || continue
    [ "${argv[0]}" = kvgw ] || continue
    sub=${argv[1]:-}
    if ! grep -qx -- "$sub" <<<"$subcommands"; then
        fail "$svc: kvgw $sub is not a kvgw command"
        continue
    fi
    help=$("$bin" "$sub" --help 2>&1)
    mapfile -t env_kv < <(awk -F'\t' -v s="$svc" '$1 == s && $2 == "env" { print $3 }' <<<"$records")
    for ((i = 2; i < ${#argv[@]}; i++)); do
        a=${argv[$i]}
        case "$a" in
        --*)
            grep -qE -- "(^|[^a-z-])$a([^a-z-]|\$)" <<<"$help" ||
                fail "$svc: kvgw $sub --help does not document $a"
            v=${argv[$((i + 1))]:-}
            case "$a" in
            --config)
                if [ ! -f "$v" ]; then
                    fail "$svc: config file $v does not exist"
                elif out=$(env -i PATH="$PATH" "${env_kv[@]}" "$bin" check-config "$v" 2>&1); then
                    ok "$svc: kvgw check-config $v (with the service's environment)"
                else
                    fail "$svc: kvgw check-config $v: $out"
                fi
                ;;
            --model)
                m=$(basename "$v")
                grep -q -- "$m" scripts/models.sh || fail "$svc: $v is not a model scripts/models.sh writes"
                ;;
            esac
            ;;
        esac
    done
    ok "$svc: kvgw ${argv[*]:1}"
done

# Builds: docker/Dockerfile and its stages.
dockerfile=docker/Dockerfile
[ -f "$dockerfile" ] || fail "$dockerfile does not exist"
for svc in $services; do
    df=$(awk -F'\t' -v s="$svc" '$1 == s && $2 == "build.dockerfile" { print $3 }' <<<"$records")
    tgt=$(awk -F'\t' -v s="$svc" '$1 == s && $2 == "build.target" { print $3 }' <<<"$records")
    [ -n "$df$tgt" ] || continue
    [ "$df" = "$dockerfile" ] || fail "$svc: builds from '$df', not $dockerfile"
    grep -qiE "^FROM .* AS $tgt\$" "$dockerfile" || fail "$svc: $dockerfile has no stage '$tgt'"
    ok "$svc: built from $dockerfile, target $tgt"
done
# The final stages: a health check each, and the non-root user of the runtime stage.
for stage in gateway worker; do
    body=$(awk -v s="$stage" 'toupper($1) == "FROM" { on = (tolower($NF) == s) } on' "$dockerfile")
    grep -q '^HEALTHCHECK' <<<"$body" || fail "$dockerfile stage $stage has no HEALTHCHECK"
    grep -qE '^CMD \["kvgw", "'"$stage"'"|^CMD \["kvgw", "serve"' <<<"$body" || fail "$dockerfile stage $stage: unexpected CMD"
done
grep -q '^USER kvgw' "$dockerfile" || fail "$dockerfile: the images do not run as the user kvgw"
grep -q 'scripts/setup.sh' "$dockerfile" || fail "$dockerfile does not build with scripts/setup.sh"
for f in $(grep -oE '^COPY (--from=[a-z]+ )?/?src/[^ ]+' "$dockerfile" | awk '{ print $NF }'); do
    rel=${f#/src/}
    case "$rel" in build/* | models/*) continue ;; esac # made in the build stage
    [ -e "$rel" ] || fail "$dockerfile copies $rel, which does not exist"
done

# Bind mounts: the host side exists.
while IFS=$'\t' read -r svc _ vol; do
    src=${vol%%:*}
    case "$src" in
    /*) [ -e "$src" ] || fail "$svc: bind mount source $src does not exist" ;;
    esac
done < <(awk -F'\t' '$2 == "volumes"' <<<"$records")
ok "bind mounts exist"

# Prometheus scrapes the gateway's port; Grafana's dashboard and datasource agree.
port=$(grep -oE "^listen: [^ ]+" conf/kvgw-compose.yaml | sed "s/.*://")
grep -q "gateway:$port" conf/prometheus.yml || fail "conf/prometheus.yml does not scrape gateway:$port"
jq -e . conf/grafana/kvgw-dashboard.json >/dev/null || fail "conf/grafana/kvgw-dashboard.json is not JSON"
uid=$(awk '/uid:/ { print $2; exit }' conf/grafana/provisioning/datasources/prometheus.yml)
bad=$(jq -r --arg uid "$uid" '[.. | objects | select(has("datasource")) | .datasource | objects | select(.uid != $uid)] | length' conf/grafana/kvgw-dashboard.json)
[ "$bad" = 0 ] || fail "kvgw-dashboard.json: $bad panels use a datasource other than $uid"
ok "prometheus scrapes gateway:$port; the dashboard uses datasource $uid"

# ---- the cluster profile -------------------------------------------------------------------
tmp=$(mktemp -d /tmp/kvgw-compose-check.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT
field() { awk -F'\t' -v s="$1" -v k="$2" '$1 == s && $2 == k { print $3 }' <<<"$records"; }
envof() { field "$1" env | sed -n "s/^$2=//p"; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# The value after option $2 in service $1's command.
argof() { field "$1" command | awk -v o="$2" 'p { print; exit } $0 == o { p = 1 }'; }

# Two gateways: their own instance ids and ledger volumes, the registry on, the same secrets.
ids=()
for gw in gateway-1 gateway-2; do
    grep -qx cluster <<<"$(field "$gw" profiles)" || fail "$gw is not in the cluster profile"
    cfgf=$(argof "$gw" --config)
    [ -f "$cfgf" ] || { fail "$gw: no config file"; continue; }
    id=$(awk '/^billing:/ { b = 1; next } /^[a-z]/ { b = 0 } b && $1 == "instance_id:" { print $2 }' "$cfgf")
    [ -n "$id" ] || fail "$cfgf sets no billing.instance_id"
    ids+=("$id")
    awk '/^registry:/ { r = 1; next } /^[a-z]/ { r = 0 } r && $1 == "enabled:" && $2 == "true" { ok = 1 } END { exit !ok }' "$cfgf" ||
        fail "$cfgf: the registry is not enabled"
    grep -qE '^  sentinels: \[' "$cfgf" || fail "$cfgf does not find Redis through the sentinels"
    vol=$(field "$gw" volumes | grep ':/var/lib/kvgw' | cut -d: -f1)
    [ -n "$vol" ] || fail "$gw has no ledger volume"
    vols+=("$vol")
done
[ "${#ids[@]}" = 2 ] && [ "${ids[0]}" != "${ids[1]}" ] || fail "gateway-1 and gateway-2 need distinct billing.instance_id (${ids[*]})"
[ "${vols[0]:-}" != "${vols[1]:-}" ] || fail "gateway-1 and gateway-2 share the ledger volume ${vols[0]:-}"
for k in KVGW_NAMESPACE_SECRET KVGW_LINK_SECRET KVGW_REDIS_PASSWORD; do
    [ -n "$(envof gateway-1 $k)" ] && [ "$(envof gateway-1 $k)" = "$(envof gateway-2 $k)" ] ||
        fail "gateway-1 and gateway-2 differ in (or lack) $k"
done
ok "gateway-1 and gateway-2: instance ids ${ids[*]}, own ledgers, the registry, the same secrets"

# HAProxy: the real haproxy accepts the file; it balances over exactly the cluster's gateways.
if ! command -v haproxy >/dev/null; then
    fail "haproxy is not installed (scripts/setup.sh installs it for the tests)"
elif out=$(haproxy -c -f conf/haproxy.cfg 2>&1); then
    ok "haproxy -c accepts conf/haproxy.cfg"
else
    fail "haproxy -c rejects conf/haproxy.cfg: $out"
fi
grep -qx "$root/conf/haproxy.cfg:/etc/haproxy/haproxy.cfg:ro" <<<"$(field haproxy volumes)" ||
    fail "haproxy does not mount conf/haproxy.cfg at /etc/haproxy/haproxy.cfg"
gwport=$(grep -oE "^listen: [^ ]+" conf/kvgw-compose-cluster-1.yaml | sed "s/.*://")
servers=$(awk '$1 == "server" { print $3 }' conf/haproxy.cfg | sort | tr '\n' ' ')
[ "$servers" = "gateway-1:$gwport gateway-2:$gwport " ] || fail "conf/haproxy.cfg balances over '$servers', not gateway-1:$gwport gateway-2:$gwport"
grep -qE '^\s+balance roundrobin' conf/haproxy.cfg || fail "conf/haproxy.cfg: not round robin"
grep -qE '^\s+http-check send meth GET uri /healthz' conf/haproxy.cfg || fail "conf/haproxy.cfg: no /healthz check"
grep -qE '^\s+retry-on conn-failure$' conf/haproxy.cfg || fail "conf/haproxy.cfg: no retry on connection failure (and only that)"
grep -qx "127.0.0.1:8080:8080/tcp" <<<"$(field haproxy ports)" || fail "haproxy does not publish 127.0.0.1:8080"
for gw in gateway-1 gateway-2; do
    [ -z "$(field "$gw" ports)" ] || fail "$gw publishes a port (the cluster's clients go through HAProxy)"
done

# Redis: the primary's and the replica's command lines on the real redis-server, on loopback.
pw=$(envof gateway-1 KVGW_REDIS_PASSWORD)
run_redis() { # SERVICE PORT [PRIMARY_PORT] -> starts it, prints nothing; pid in pids
    local svc=$1 port=$2 pport=${3:-} a=() prev=""
    mapfile -t argv < <(field "$svc" command)
    for ((i = 1; i < ${#argv[@]}; i++)); do
        v=${argv[$i]}
        case "$prev" in
        --port) v=$port ;;
        --dir) mkdir -p "$tmp/$svc" && v=$tmp/$svc ;;
        --replica-announce-ip) v=127.0.0.1 ;;
        --replicaof) v=127.0.0.1 ;;
        esac
        [ "${argv[$((i - 2))]:-}" = --replicaof ] && [ $i -ge 3 ] && v=$pport
        a+=("$v")
        prev=${argv[$i]}
    done
    [ "${argv[0]}" = redis-server ] || { fail "$svc does not run redis-server"; return 1; }
    redis-server "${a[@]}" --bind 127.0.0.1 --daemonize no --logfile "$tmp/$svc.log" &
    pids+=($!)
}
rcli() { REDISCLI_AUTH=$pw redis-cli -p "$1" "${@:2}" 2>/dev/null; }
wait_ping() { for _ in $(seq 100); do [ "$(rcli "$1" ping)" = PONG ] && return 0; sleep 0.1; done; return 1; }
p1=$(free_port)
p2=$(free_port)
while [ "$p2" = "$p1" ]; do p2=$(free_port); done
run_redis redis-primary "$p1" && run_redis redis-replica "$p2" "$p1"
if wait_ping "$p1" && wait_ping "$p2"; then
    for p in "$p1" "$p2"; do
        [ "$(rcli "$p" config get maxmemory-policy | tail -1)" = noeviction ] || fail "Redis on $p: not noeviction"
        [ "$(rcli "$p" config get appendonly | tail -1)" = yes ] || fail "Redis on $p: not append-only"
    done
    [ "$(REDISCLI_AUTH= redis-cli -p "$p1" set k v 2>&1 | grep -c NOAUTH)" = 1 ] || fail "redis-primary answers without the password"
    up=""
    for _ in $(seq 100); do
        up=$(rcli "$p2" info replication | tr -d '\r' | sed -n 's/^master_link_status://p')
        [ "$up" = up ] && break
        sleep 0.1
    done
    [ "$up" = up ] || fail "redis-replica does not replicate redis-primary with the gateways' password (link: $up)"
    ok "redis-primary and redis-replica run on redis-server: noeviction, append-only, replicating, password"
else
    fail "redis-primary / redis-replica: redis-server did not start ($(tail -3 "$tmp"/redis-*.log 2>/dev/null))"
fi

# The sentinels: their command (copy the file, append the password, exec redis-sentinel) with
# the paths, the primary's name and the ports mapped to this machine.
ps_=$(free_port)
sed -e "s/^port .*/port $ps_/" -e "s/ redis-primary 6379 / 127.0.0.1 $p1 /" conf/redis-sentinel.conf >"$tmp/sentinel.conf"
grep -q "^sentinel monitor kvgw 127.0.0.1 $p1 2\$" "$tmp/sentinel.conf" || fail "conf/redis-sentinel.conf does not monitor kvgw at redis-primary 6379 with quorum 2"
for s in sentinel-1 sentinel-2 sentinel-3; do
    grep -qx "$root/conf/redis-sentinel.conf:/etc/kvgw/redis-sentinel.conf:ro" <<<"$(field "$s" volumes)" || fail "$s does not mount conf/redis-sentinel.conf"
    [ "$(envof "$s" KVGW_REDIS_PASSWORD)" = "$pw" ] || fail "$s has another Redis password than the gateways"
done
mapfile -t sargv < <(field sentinel-1 command)
if [ "${sargv[0]:-}" = sh ] && [ "${sargv[1]:-}" = -c ]; then
    mkdir -p "$tmp/s1"
    script=${sargv[2]//\$\$/\$}
    script=${script//\/etc\/kvgw\/redis-sentinel.conf/$tmp\/sentinel.conf}
    script=${script//\/data\//$tmp\/s1\/}
    KVGW_REDIS_PASSWORD=$pw sh -c "$script" >"$tmp/sentinel.log" 2>&1 &
    pids+=($!)
    # Up, and authenticated: the replica is known from the primary's INFO, which needs the
    # password (auth-pass) the command appended.
    m=""
    for _ in $(seq 100); do
        m=$(redis-cli -p "$ps_" sentinel master kvgw 2>/dev/null | paste - - | awk -F'\t' '$1 == "flags" || $1 == "quorum" || $1 == "num-slaves" { printf "%s=%s ", $1, $2 }')
        [ "$m" = "flags=master num-slaves=1 quorum=2 " ] && break
        sleep 0.1
    done
    if [ "$m" = "flags=master num-slaves=1 quorum=2 " ]; then
        ok "sentinel-1's command runs redis-sentinel on conf/redis-sentinel.conf: kvgw watched, quorum 2, authenticated, the replica found"
    else
        fail "redis-sentinel on conf/redis-sentinel.conf: '$m', want flags=master num-slaves=1 quorum=2 ($(tail -3 "$tmp/sentinel.log"))"
    fi
else
    fail "sentinel-1: unexpected command ${sargv[*]}"
fi

# Prometheus of the cluster profile scrapes both gateways.
for gw in gateway-1 gateway-2; do
    grep -q "\"$gw:$gwport\"" conf/prometheus-cluster.yml || fail "conf/prometheus-cluster.yml does not scrape $gw:$gwport"
done
grep -qx "$root/conf/prometheus-cluster.yml:/etc/prometheus/prometheus.yml:ro" <<<"$(field prometheus-cluster volumes)" ||
    fail "prometheus-cluster does not mount conf/prometheus-cluster.yml"
ok "prometheus-cluster scrapes gateway-1:$gwport and gateway-2:$gwport"

if [ "$fails" -gt 0 ]; then
    echo "$fails check(s) failed"
    exit 1
fi
echo "compose_check: all checks passed"
