#!/usr/bin/env bash
# Build the CPU image and run it for real, on a machine without a container registry (Debian's
# podman, runc and debootstrap): a base image from debootstrap, the image built on it, started with
# `swiftlm serve` flags after the image name, /health, one chat answer from the bundled model through
# the openai client, SIGTERM, and the image's size. Not part of CI (minutes of downloads).
#
#   bash scripts/container_check.sh            # needs root (apt, debootstrap) and network to the
#                                              # Debian mirror and the package index pip uses
#
# Where pip reads a local index (this project's machines), the host's pip configuration and wheel
# directories are passed into the build.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
WORK=${WORK:-/tmp/swiftlm-container-check}
IMAGE=localhost/swiftlm:cpu
BASE=localhost/debian:bookworm
PORT=${PORT:-8765}
mkdir -p "$WORK"
log() { echo "== $*"; }

if ! command -v podman >/dev/null || ! command -v runc >/dev/null || ! command -v debootstrap >/dev/null; then
  log "installing podman, runc, debootstrap"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc debootstrap >/dev/null
fi
# the sandbox cannot raise rlimits: no default ulimits for containers
cat > "$WORK/containers.conf" <<'EOF'
[containers]
default_ulimits = []
EOF
export CONTAINERS_CONF="$WORK/containers.conf"
PODMAN=(podman --runtime runc)

if ! "${PODMAN[@]}" image exists "$BASE"; then
  log "base image: debootstrap --variant=minbase bookworm"
  rm -rf "$WORK/rootfs"
  debootstrap --variant=minbase bookworm "$WORK/rootfs" >/dev/null
  tar -C "$WORK/rootfs" -c . | "${PODMAN[@]}" import - "$BASE" >/dev/null
fi

# pip inside the build reads what the host's pip reads: its index options and CA bundle (a proxy's CA
# may be in it) in a pip.conf of their own, and the local wheel and index directories they name
pip_index=$(pip config get global.extra-index-url 2>/dev/null || true)
pip_links=${PIP_FIND_LINKS:-$(pip config get global.find-links 2>/dev/null || true)}
{
  echo "[global]"
  echo "cert = /etc/ssl/host-ca.crt"
  [ -n "$pip_index" ] && echo "extra-index-url = $pip_index"
  [ -n "$pip_links" ] && echo "find-links = $pip_links"
} > "$WORK/pip.conf"
mounts=(--volume "$WORK/pip.conf:/etc/pip.conf:ro" --volume /etc/ssl/certs/ca-certificates.crt:/etc/ssl/host-ca.crt:ro)
for dir in /opt/wheels /opt/pypi /opt/pypi-more; do
  [ -d "$dir" ] && mounts+=(--volume "$dir:$dir:ro")
done
# torch's CPU wheel: from the host's indexes where it has some (the default is download.pytorch.org)
pip_args=()
[ -n "$pip_index" ] && pip_args+=(--build-arg PIP_EXTRA_INDEX_URL="${pip_index%% *}")

log "building $IMAGE on $BASE"
start=$(date +%s)
"${PODMAN[@]}" build --format docker --network host "${mounts[@]}" "${pip_args[@]}" \
  --build-arg BASE_IMAGE="$BASE" -f docker/Dockerfile.cpu -t "$IMAGE" . > "$WORK/build.log" 2>&1 \
  || { tail -30 "$WORK/build.log"; exit 1; }
log "built in $(( $(date +%s) - start )) s"

log "run: $IMAGE --port $PORT --served-model-name smol (flags after the image name reach swiftlm serve)"
"${PODMAN[@]}" rm -f swiftlm-check >/dev/null 2>&1 || true
mkdir -p "$WORK/data" && chmod 777 "$WORK/data"  # the image's user (uid 1000) writes there
"${PODMAN[@]}" run -d --name swiftlm-check --network host -v "$WORK/data:/data" \
  "$IMAGE" --port "$PORT" --served-model-name smol >/dev/null
for _ in $(seq 1 450); do  # a first start on a CPU compiles the kernels: minutes
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
  sleep 2
done
curl -sf "http://127.0.0.1:$PORT/health" >/dev/null || { "${PODMAN[@]}" logs swiftlm-check | tail -30; exit 1; }
log "healthy after $(( $(date +%s) - start )) s from the build's start; the engine's plan:"
"${PODMAN[@]}" logs swiftlm-check 2>&1 | grep -E "engine ready|^  |compiling|unavailable" | grep -v "^time=" | head -20

"$ROOT/.venv/bin/python" - "$PORT" <<'EOF'
import sys

from openai import OpenAI

client = OpenAI(base_url=f"http://127.0.0.1:{sys.argv[1]}/v1", api_key="none")
assert [m.id for m in client.models.list()] == ["smol"], "the flag after the image name was not applied"
answer = client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "What is the capital of France?"}],
                                        max_tokens=24, temperature=0)
print("chat:", repr(answer.choices[0].message.content))
assert answer.choices[0].message.content
EOF

log "SIGTERM"
"${PODMAN[@]}" kill --signal TERM swiftlm-check >/dev/null
code=$("${PODMAN[@]}" wait swiftlm-check)
"${PODMAN[@]}" logs swiftlm-check 2>&1 | tail -4
"${PODMAN[@]}" rm swiftlm-check >/dev/null
[ "$code" = 0 ] || { echo "exit status $code after SIGTERM"; exit 1; }
log "stopped cleanly (exit status 0)"
log "image size: $("${PODMAN[@]}" image inspect "$IMAGE" --format '{{.Size}}' | awk '{printf "%.2f GB", $1 / 1e9}')"
