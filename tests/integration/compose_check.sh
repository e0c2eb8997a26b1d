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
#     the Grafana dashboard is valid JSON with the provisioned datasource's uid.
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
    /^services:/ { in_s = 1; next }
    /^[a-z]/ { in_s = 0 }
    !in_s { next }
    /^  [A-Za-z0-9_.-]+:$/ { svc = substr($1, 1, length($1) - 1); sect = ""; next }
    /^    [a-z_]+:/ {
        key = $1; sub(/:$/, "", key); sect = key
        if (key == "image") print svc "\timage\t" $2
        next
    }
    /^    - / && (sect == "command" || sect == "volumes" || sect == "profiles") {
        v = substr($0, 7); gsub(/^'\''|'\''$/, "", v); print svc "\t" sect "\t" v; next
    }
    /^      [a-z_]+:/ && sect == "build" {
        k = $1; sub(/:$/, "", k); v = $2; print svc "\tbuild." k "\t" v; next
    }
    /^      [A-Z_]+:/ && sect == "environment" {
        k = $1; sub(/:$/, "", k); v = $2; gsub(/^'\''|'\''$/, "", v); print svc "\tenv\t" k "=" v; next
    }
' <<<"$cfg")
services=$(cut -f1 <<<"$records" | sort -u)
for want in redis gateway prometheus grafana worker-cpu-1 worker-cpu-2 worker-gpu-1 worker-gpu-2; do
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

if [ "$fails" -gt 0 ]; then
    echo "$fails check(s) failed"
    exit 1
fi
echo "compose_check: all checks passed"
