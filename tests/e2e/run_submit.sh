#!/usr/bin/env bash
# End-to-end test of the cluster launcher path: `ray up` -> `ray submit` -> `ray down`,
# for real, over SSH, on this machine (invoked by `make test-submit`).
#
# Usage: tests/e2e/run_submit.sh [--expect MARKER] [--timeout SECONDS] [--keep]
#                                [--then 'SCRIPT|MARKER|ARGS' ...] [SCRIPT] [-- SCRIPT_ARGS...]
#   SCRIPT    script to `ray submit` (default: examples/train.py)
#   --expect  line prefix the submitted script must print on success
#             (default: "rayshard demo: OK"; tests/e2e/hello_ray.py prints "rayshard e2e hello: OK")
#   --then    one more script submitted to the same cluster afterwards, with the marker it
#             must print and its arguments (space-separated), e.g.
#             --then 'examples/train_text.py|rayshard text: OK|--epochs=1'; repeatable
#   --timeout limit for each `ray submit` (default 300 s)
#   --keep    keep the temp dir (configs, logs) for debugging
#
# What it does (needs root: it creates a user and runs an sshd; installs what is missing with
# apt-get, non-interactively):
#   1. a throwaway user `rayshard-e2e-<pid>` with a throwaway home under a temp dir, whose
#      ~/.bashrc puts ~/venv/bin on PATH and sets RAY_AUTH_MODE=token and a private RAY_TMPDIR;
#   2. OpenSSH's sshd on 127.0.0.1:<free port> with a throwaway host key, accepting only a
#      throwaway client key for that user (Ray's launcher has no SSH port setting: it connects
#      through `auth.ssh_proxy_command: nc %h <port>`);
#   3. a launcher config for Ray's `local` provider (head_ip 127.0.0.1, no workers) that, like
#      cluster.yaml, syncs the project to ~/rayshard-src and `pip install -e`s it on the head,
#      generates a Ray auth token there and starts Ray on free ports (no `ray stop`);
#   4. `ray up -y`, `ray submit` (output checked for the marker line), a check that a driver
#      with a wrong auth token is refused, `ray down -y`;
#   5. on exit, whatever happens: stops the cluster, ends the user's processes, stops the sshd it
#      started, restores the ACLs it changed, deletes the user and the temp dir.
# Ray processes of other users (e.g. root's test sessions) are never touched.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SCRIPT="examples/train.py"
EXPECT="rayshard demo: OK"
SUBMIT_TIMEOUT=300
KEEP=0
SCRIPT_ARGS=()
THEN=()
while [ $# -gt 0 ]; do
    case "$1" in
        --then) THEN+=("$2"); shift 2 ;;
        --then=*) THEN+=("${1#*=}"); shift ;;
        --expect) EXPECT="$2"; shift 2 ;;
        --expect=*) EXPECT="${1#*=}"; shift ;;
        --timeout) SUBMIT_TIMEOUT="$2"; shift 2 ;;
        --timeout=*) SUBMIT_TIMEOUT="${1#*=}"; shift ;;
        --keep) KEEP=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
        --) shift; SCRIPT_ARGS=("$@"); break ;;
        -*) echo "run_submit: unknown option $1" >&2; exit 2 ;;
        *) SCRIPT="$1"; shift ;;
    esac
done

log() { printf '[run_submit %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { printf '[run_submit] FAILED: %s\n' "$*" >&2; exit 1; }

START_TS=$(date +%s)
cd "$REPO"
[ -f "$SCRIPT" ] || die "script '$SCRIPT' not found (run from anywhere; paths are relative to $REPO). \
For the stand-in: bash tests/e2e/run_submit.sh tests/e2e/hello_ray.py --expect 'rayshard e2e hello: OK'"
SCRIPT="$(realpath "$SCRIPT")"
for entry in ${THEN[@]+"${THEN[@]}"}; do
    [ -f "${entry%%|*}" ] || die "--then script '${entry%%|*}' not found (paths are relative to $REPO)"
done
[ "$(id -u)" -eq 0 ] || die "must run as root (creates a throwaway user and runs sshd); try: sudo make test-submit"

# The project's interpreter (the Makefile's venv) and its `ray` CLI.
PY="${RAYSHARD_E2E_PYTHON:-$REPO/.venv/bin/python}"
[ -x "$PY" ] || die "no interpreter at $PY: run \`make test-submit\` (creates .venv) or set RAYSHARD_E2E_PYTHON"
RAY_CLI="$(dirname "$PY")/ray"
[ -x "$RAY_CLI" ] || die "no ray CLI next to $PY"
PROJECT_SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"

# ---------------------------------------------------------------- system packages
need_pkgs=()
[ -x /usr/sbin/sshd ] || need_pkgs+=(openssh-server)
command -v ssh >/dev/null || need_pkgs+=(openssh-client)
command -v rsync >/dev/null || need_pkgs+=(rsync)
command -v nc >/dev/null || need_pkgs+=(netcat-openbsd)
command -v setfacl >/dev/null || need_pkgs+=(acl)
command -v ssh-keygen >/dev/null || need_pkgs+=(openssh-client)
if [ ${#need_pkgs[@]} -gt 0 ]; then
    log "installing ${need_pkgs[*]} with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null || die "apt-get update failed"
    apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null \
        || die "apt-get install ${need_pkgs[*]} failed"
fi

# ---------------------------------------------------------------- cleanup (trap EXIT)
WORK="$(mktemp -d /tmp/rse2e.XXXXXX)"
chmod 755 "$WORK"
E2E_USER="rayshard-e2e-$$"
CLUSTER="rayshard-e2e-$$"
CFG="$WORK/cluster-local.yaml"
SSHD_PID=""
USER_CREATED=0
CLUSTER_UP=0
RUN_SSHD_CREATED=0
ACL_BACKUPS=()
MODE_BACKUPS=()
# The launcher's own state (cluster lock/state files, config cache) stays inside $WORK.
LAUNCH_ENV=(env "TMPDIR=$WORK/launcher" "RAY_TMPDIR=$WORK/launcher" RAY_USAGE_STATS_ENABLED=0)
mkdir -p "$WORK/launcher"

cleanup() {
    local rc=$?
    set +e
    trap - EXIT INT TERM
    if [ "$CLUSTER_UP" = 1 ]; then
        log "cleanup: ray down"
        timeout 90 "${LAUNCH_ENV[@]}" "$RAY_CLI" down -y "$CFG" >>"$WORK/down.log" 2>&1
    fi
    if [ "$USER_CREATED" = 1 ]; then
        # Only processes of the throwaway user: all of them were started by this run.
        local pids
        pids="$(pgrep -u "$E2E_USER" || true)"
        if [ -n "$pids" ]; then
            # shellcheck disable=SC2086
            kill -TERM $pids 2>/dev/null; sleep 2
            pids="$(pgrep -u "$E2E_USER" || true)"
            # shellcheck disable=SC2086
            [ -z "$pids" ] || kill -KILL $pids 2>/dev/null
        fi
    fi
    if [ -n "$SSHD_PID" ]; then
        kill "$SSHD_PID" 2>/dev/null; wait "$SSHD_PID" 2>/dev/null
    fi
    local backup
    for backup in "${ACL_BACKUPS[@]}"; do
        setfacl --restore="$backup" 2>/dev/null || log "cleanup: could not restore ACL from $backup"
    done
    for backup in "${MODE_BACKUPS[@]}"; do
        read -r mode dir <"$backup" && chmod "$mode" "$dir" || log "cleanup: could not restore mode of $dir"
    done
    if [ "$USER_CREATED" = 1 ]; then
        sleep 0.5
        userdel "$E2E_USER" 2>/dev/null || { sleep 2; userdel -f "$E2E_USER"; } \
            || log "cleanup: could not delete user $E2E_USER"
    fi
    [ "$RUN_SSHD_CREATED" = 1 ] && rmdir /run/sshd 2>/dev/null
    # Ray's ssh ControlPath dir for this cluster: /tmp/ray_ssh_<hash(user)>/<hash(cluster)>.
    local ctl
    ctl="/tmp/ray_ssh_$(printf %s "$(id -un)" | sha256sum | cut -c1-10)"
    rm -rf "$ctl/$(printf %s "$CLUSTER" | sha256sum | cut -c1-10)"
    rmdir "$ctl" 2>/dev/null
    if [ "$KEEP" = 1 ]; then
        log "kept $WORK (configs and logs; the user and sshd are gone)"
    else
        rm -rf "$WORK"
    fi
    log "done in $(( $(date +%s) - START_TS )) s (exit $rc)"
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

show_tail() {  # show_tail FILE: last lines of a log, for failure messages
    echo "----- last lines of $1 -----" >&2
    tail -n 40 "$1" | tr -d '\r' >&2 || true
    echo "-----" >&2
}

# ---------------------------------------------------------------- free ports
read -r SSH_PORT GCS_PORT CLIENT_PORT AGENT_HTTP_PORT AGENT_GRPC_PORT METRICS_PORT \
    RUNTIME_ENV_PORT NODE_MANAGER_PORT OBJECT_MANAGER_PORT < <("$PY" - <<'EOF'
import socket
socks = []
for _ in range(9):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
)
log "work dir $WORK; ssh port $SSH_PORT; Ray GCS port $GCS_PORT"

# ---------------------------------------------------------------- throwaway user
E2E_HOME="$WORK/home"
useradd --no-create-home --home-dir "$E2E_HOME" --shell /bin/bash \
    --comment "rayshard e2e (throwaway)" "$E2E_USER" || die "useradd $E2E_USER failed"
USER_CREATED=1
usermod -p '*' "$E2E_USER"   # no password, but not "locked" (sshd refuses locked accounts)
mkdir -p "$E2E_HOME/.ssh" "$WORK/raytmp"
cat >"$E2E_HOME/.bashrc" <<EOF
# Written by tests/e2e/run_submit.sh. \`ray up\`/\`ray submit\` run every command as
# \`bash --login -c -i 'source ~/.bashrc; ...'\`, so this is the environment of the head node.
export PATH="\$HOME/venv/bin:\$PATH"
export VIRTUAL_ENV="\$HOME/venv"
# Ray >= 2.52 token authentication: on for this cluster (token in ~/.ray/auth_token).
export RAY_AUTH_MODE=token
# A private Ray temp dir: /tmp/ray may belong to root (the launcher, other test sessions).
export RAY_TMPDIR="$WORK/raytmp"
export RAY_USAGE_STATS_ENABLED=0
export RAY_ENABLE_UV_RUN_RUNTIME_ENV=0
EOF
printf '[ -n "$BASH_VERSION" ] && [ -f ~/.bashrc ] && . ~/.bashrc\n' >"$E2E_HOME/.profile"
chown -R "$E2E_USER:" "$E2E_HOME" "$WORK/raytmp"
chmod 755 "$E2E_HOME"

# The user must be able to run the project's interpreter, which may live under a private
# directory (e.g. pyenv under /root, mode 700): grant just traverse (x) on such directories
# to this user with ACLs, backed up and restored on exit.
grant_traverse() {  # grant_traverse DIR: make DIR and its ancestors traversable, top down
    local dir="$1" chain=() i
    while [ "$dir" != "/" ] && [ -n "$dir" ]; do chain+=("$dir"); dir="$(dirname "$dir")"; done
    for (( i=${#chain[@]}-1; i>=0; i-- )); do
        dir="${chain[$i]}"
        if ! runuser -u "$E2E_USER" -- test -x "$dir" 2>/dev/null; then
            local backup="$WORK/acl.$(echo "$dir" | tr '/' '_')"
            if [ ! -e "$backup" ]; then
                if getfacl --absolute-names "$dir" >"$backup" 2>/dev/null \
                        && setfacl -m "u:$E2E_USER:x" "$dir" 2>/dev/null; then
                    ACL_BACKUPS+=("$backup")
                    log "granted $E2E_USER traverse on $dir (ACL, restored on exit)"
                else  # no ACL support here: o+x for the duration of the run
                    echo "$(stat -c %a "$dir") $dir" >"$backup"
                    chmod o+x "$dir" || die "cannot make $dir traversable for $E2E_USER"
                    MODE_BACKUPS+=("$backup")
                    log "made $dir traversable (o+x; mode restored on exit)"
                fi
            fi
        fi
    done
}
for path in "$("$PY" -c 'import sys, os; print(os.path.realpath(sys.executable))')" \
            "$("$PY" -c 'import sys; print(sys.base_prefix)')/lib" "$PROJECT_SITE"; do
    grant_traverse "$path"
done
runuser -u "$E2E_USER" -- "$PY" -c 'import ray' 2>"$WORK/import.err" || {
    show_tail "$WORK/import.err"
    die "user $E2E_USER cannot run '$PY -c \"import ray\"' (permissions?)"
}

# ---------------------------------------------------------------- sshd on a free port
ssh-keygen -q -t ed25519 -N '' -C "rayshard-e2e-host" -f "$WORK/ssh_host_ed25519_key"
ssh-keygen -q -t ed25519 -N '' -C "rayshard-e2e-client" -f "$WORK/client_key"
cp "$WORK/client_key.pub" "$E2E_HOME/.ssh/authorized_keys"
chown -R "$E2E_USER:" "$E2E_HOME/.ssh"
chmod 700 "$E2E_HOME/.ssh"; chmod 600 "$E2E_HOME/.ssh/authorized_keys"
cat >"$WORK/sshd_config" <<EOF
Port $SSH_PORT
ListenAddress 127.0.0.1
HostKey $WORK/ssh_host_ed25519_key
PidFile $WORK/sshd.pid
AllowUsers $E2E_USER
PermitRootLogin no
PubkeyAuthentication yes
AuthorizedKeysFile .ssh/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes yes
MaxStartups 100
MaxSessions 100
LogLevel VERBOSE
Subsystem sftp internal-sftp
EOF
if [ ! -d /run/sshd ]; then mkdir -p /run/sshd && chmod 755 /run/sshd; RUN_SSHD_CREATED=1; fi
/usr/sbin/sshd -t -f "$WORK/sshd_config" || die "sshd rejected its config ($WORK/sshd_config)"
/usr/sbin/sshd -D -e -f "$WORK/sshd_config" >"$WORK/sshd.log" 2>&1 &
SSHD_PID=$!
for _ in $(seq 50); do nc -z 127.0.0.1 "$SSH_PORT" 2>/dev/null && break; sleep 0.1; done
nc -z 127.0.0.1 "$SSH_PORT" || { show_tail "$WORK/sshd.log"; die "sshd did not start on port $SSH_PORT"; }
# Ray's launcher has no SSH-port setting: reach the port through ProxyCommand instead.
PROXY="nc %h $SSH_PORT"
ssh -i "$WORK/client_key" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
    -o IdentitiesOnly=yes -o BatchMode=yes -o ConnectTimeout=10 -o "ProxyCommand=$PROXY" \
    "$E2E_USER@127.0.0.1" true 2>"$WORK/ssh_check.err" || {
    show_tail "$WORK/ssh_check.err"; show_tail "$WORK/sshd.log"; die "ssh to $E2E_USER@127.0.0.1:$SSH_PORT failed"; }
log "sshd (pid $SSHD_PID) accepts $E2E_USER@127.0.0.1:$SSH_PORT"

# ---------------------------------------------------------------- launcher config
export CLUSTER E2E_USER WORK PROXY REPO PY PROJECT_SITE GCS_PORT CLIENT_PORT AGENT_HTTP_PORT \
    AGENT_GRPC_PORT METRICS_PORT RUNTIME_ENV_PORT NODE_MANAGER_PORT OBJECT_MANAGER_PORT
"$PY" - "$CFG" <<'EOF'
import os
import sys

import yaml

e = os.environ
ray_start = " ".join([
    "ulimit -n 65536 2>/dev/null;",
    "ray start --head --node-ip-address=127.0.0.1",
    f"--port={e['GCS_PORT']}",
    f"--dashboard-agent-listen-port={e['AGENT_HTTP_PORT']}",
    f"--dashboard-agent-grpc-port={e['AGENT_GRPC_PORT']}",
    f"--metrics-export-port={e['METRICS_PORT']}",
    f"--runtime-env-agent-port={e['RUNTIME_ENV_PORT']}",
    f"--node-manager-port={e['NODE_MANAGER_PORT']}",
    f"--object-manager-port={e['OBJECT_MANAGER_PORT']}",
    "--num-cpus=4 --object-store-memory=500000000",
    "--include-dashboard=false --disable-usage-stats",
    "--autoscaling-config=~/ray_bootstrap_config.yaml",
])
try:  # Ray Client (default port 10001) starts only where ray[client] is installed.
    from ray._private.utils import get_ray_client_dependency_error

    if get_ray_client_dependency_error() is None:
        ray_start += f" --ray-client-server-port={e['CLIENT_PORT']}"
except ImportError:
    pass
config = {
    "cluster_name": e["CLUSTER"],
    "provider": {"type": "local", "head_ip": "127.0.0.1", "worker_ips": []},
    "auth": {
        "ssh_user": e["E2E_USER"],
        "ssh_private_key": os.path.join(e["WORK"], "client_key"),
        # The launcher has no ssh port option; sshd listens on a free port.
        "ssh_proxy_command": e["PROXY"],
    },
    "max_workers": 0,
    "upscaling_speed": 1.0,
    "idle_timeout_minutes": 5,
    # Same layout as cluster.yaml: the project, synced to ~/rayshard-src, `pip install -e`d.
    "file_mounts": {"~/rayshard-src": e["REPO"]},
    "rsync_exclude": ["**/.git", "**/.git/**"],
    "rsync_filter": [".gitignore"],
    "initialization_commands": [],
    "setup_commands": [
        # A venv of the user's own that sees the project's installed packages (ray, torch, ...)
        # through a .pth file, so that nothing has to be downloaded; rayshard itself is
        # installed from the synced copy, as on a real cluster.
        f"test -x ~/venv/bin/python || {e['PY']} -m venv --without-pip ~/venv",
        "echo " + e["PROJECT_SITE"] + " > \"$(~/venv/bin/python -c "
        "'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')/_rayshard_e2e_deps.pth\"",
        "printf '#!%s\\nimport sys\\nfrom ray.scripts.scripts import main\\nsys.exit(main())\\n'"
        " ~/venv/bin/python > ~/venv/bin/ray && chmod +x ~/venv/bin/ray",
        "python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation"
        " -e ~/rayshard-src",
    ],
    # Ray token authentication: a token on the head (RAY_AUTH_MODE=token is in ~/.bashrc).
    "head_setup_commands": ["ray get-auth-token --generate > /dev/null"],
    "worker_setup_commands": [],
    # Deliberately no `ray stop` first: start only this cluster's Ray.
    "head_start_ray_commands": [ray_start],
    "worker_start_ray_commands": [],
}
with open(sys.argv[1], "w") as f:
    yaml.safe_dump(config, f, sort_keys=False, width=1000)
EOF

# ---------------------------------------------------------------- ray up / submit / down
log "ray up ($CFG)"
CLUSTER_UP=1
if ! timeout 300 "${LAUNCH_ENV[@]}" "$RAY_CLI" up -y --no-config-cache "$CFG" >"$WORK/up.log" 2>&1; then
    show_tail "$WORK/up.log"; die "ray up failed (rerun with --keep to keep $WORK/up.log)"
fi
log "ray up OK ($(( $(date +%s) - START_TS )) s so far)"

# submit_one SCRIPT LOG [ARGS...]: one `ray submit`; its exit status in SUBMIT_RC.
submit_one() {
    local script="$1" log_file="$2"; shift 2
    log "ray submit $(basename "$script") $*"
    set +e
    timeout "$SUBMIT_TIMEOUT" "${LAUNCH_ENV[@]}" "$RAY_CLI" submit --no-config-cache "$CFG" \
        "$script" "$@" 2>&1 | tr -d '\r' | tee "$log_file"
    SUBMIT_RC=${PIPESTATUS[0]}
    set -e
    log "ray submit $(basename "$script") exited with $SUBMIT_RC"
}

# check_one SCRIPT MARKER LOG RC: "" if the submission passed, else why not.
check_one() {
    local name; name="$(basename "$1")"
    if [ "$4" -eq 124 ]; then
        echo "ray submit $name timed out after ${SUBMIT_TIMEOUT}s"
    elif ! grep -q -F -- "$2" "$3"; then
        echo "the output of ray submit $name has no line with '$2' (exit code $4)"
    elif [ "$4" -ne 0 ]; then
        echo "ray submit $name exited with $4 although the marker was printed"
    fi
}

submit_one "$SCRIPT" "$WORK/submit.log" ${SCRIPT_ARGS[@]+"${SCRIPT_ARGS[@]}"}
FAILED="$(check_one "$SCRIPT" "$EXPECT" "$WORK/submit.log" "$SUBMIT_RC")"
PASSED=("$(basename "$SCRIPT"): $(grep -F -- "$EXPECT" "$WORK/submit.log" | tail -n 1)")
index=0
for entry in ${THEN[@]+"${THEN[@]}"}; do
    [ -z "$FAILED" ] || break
    index=$((index + 1))
    IFS='|' read -r then_script then_marker then_args <<<"$entry"
    read -r -a then_argv <<<"$then_args"
    submit_one "$(realpath "$then_script")" "$WORK/then-$index.log" \
        ${then_argv[@]+"${then_argv[@]}"}
    FAILED="$(check_one "$then_script" "$then_marker" "$WORK/then-$index.log" "$SUBMIT_RC")"
    PASSED+=("$(basename "$then_script"): $(grep -F -- "$then_marker" "$WORK/then-$index.log" | tail -n 1)")
done

if [ -z "$FAILED" ]; then
    # Token authentication must really be on: a driver with a wrong token must be refused
    # (Ray keeps retrying; 15 s is plenty for the first "Unauthenticated" answer).
    log "checking that the cluster refuses a driver with a wrong auth token"
    timeout 120 "${LAUNCH_ENV[@]}" "$RAY_CLI" exec --no-config-cache "$CFG" \
        "RAY_AUTH_TOKEN=wrong-token-rayshard-e2e timeout 15 python -c 'import ray; ray.init(address=\"auto\"); print(\"WRONG-TOKEN-\" + \"ACCEPTED\")'" \
        >"$WORK/auth_check.log" 2>&1 || true
    if grep -q "WRONG-TOKEN-ACCEPTED" "$WORK/auth_check.log"; then
        AUTH_CHECK="FAILED: a driver with a wrong token connected (token auth is off?)"
    elif grep -q -E "Unauthenticated|InvalidAuthToken" "$WORK/auth_check.log"; then
        AUTH_CHECK="ok"
    else
        AUTH_CHECK="FAILED: no 'Unauthenticated' answer for a driver with a wrong token"
    fi
    log "wrong-token check: $AUTH_CHECK"
fi

log "ray down"
if timeout 120 "${LAUNCH_ENV[@]}" "$RAY_CLI" down -y "$CFG" >"$WORK/down.log" 2>&1; then
    CLUSTER_UP=0
else
    show_tail "$WORK/down.log"; log "ray down failed; cleanup will end the user's processes"
fi

[ -z "$FAILED" ] || die "$FAILED"
for line in "${PASSED[@]}"; do log "found: $line"; done
log "PASSED: ray up + ray submit $(basename "$SCRIPT") + ray down; found: $(grep -F -- "$EXPECT" "$WORK/submit.log" | tail -n 1)"
