#!/bin/sh
# The deployment files, checked offline (docs/deploy.md):
#
#   scripts/check-deploy.sh
#
# 1. scripts/check_deploy.py --self-test: every manifest in deploy/kubernetes
#    and what its kustomizations render (as they come, with the TLS patches,
#    with the data patch), against Kubernetes' schemas (kubernetes-validate,
#    strict) from the oldest version the manifests claim, 1.27, and its
#    feature gates, the TFJob against the vendored Training Operator CRD,
#    the StatefulSets, their volumes and the NetworkPolicy against dtf.toml,
#    and scripts/make-tls-cert.sh's certificate with openssl; first, each of
#    those checks must catch a mistake made on purpose.
# 2. dtf's own checks of both dtf.toml files, as the daemons run them
#    (`dtf-ps check-config`, ...): the StatefulSets' with --task, plain and
#    with a certificate of scripts/make-tls-cert.sh, the TFJob's with a
#    TF_CONFIG as the Training Operator writes it.
#
# The Python tools go into a virtual environment under the cache directory
# ($DTF_CHECK_DEPLOY_VENV, default ${XDG_CACHE_HOME:-~/.cache}/dtf/check-deploy-venv),
# made once, never into the system's Python. The daemons come from
# $DTF_BIN_DIR, else target/debug or target/release, else `cargo build`.
set -eu
cd "$(dirname "$0")/.."

# Pinned: a new schema release must not change CI's verdict unseen.
REQUIREMENTS="kubernetes-validate==1.37.0 jsonschema==4.26.0 jsonpatch==1.33 PyYAML==6.0.2"

fail() { printf 'check-deploy: FAILED: %s\n' "$*" >&2; exit 1; }

if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
	echo "== apt-get install python3-venv"
	apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-venv
fi
venv=${DTF_CHECK_DEPLOY_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dtf/check-deploy-venv}
stamp="$venv/.requirements"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$REQUIREMENTS" ]; then
	echo "== python3 -m venv $venv ($REQUIREMENTS)"
	python3 -m venv --clear "$venv" || fail "python3 -m venv"
	# shellcheck disable=SC2086 # a list of requirements
	"$venv/bin/pip" install -q --disable-pip-version-check $REQUIREMENTS || fail "pip install"
	echo "$REQUIREMENTS" >"$stamp"
fi

echo "== manifests (scripts/check_deploy.py --self-test)"
"$venv/bin/python" scripts/check_deploy.py --self-test || fail "manifests"

echo "== dtf's own checks of the deployment's dtf.toml"
bin=${DTF_BIN_DIR:-}
if [ -z "$bin" ]; then
	for dir in target/debug target/release; do
		if [ -x "$dir/dtf-ps" ] && [ -x "$dir/dtf-worker" ] && [ -x "$dir/dtf-evaluator" ]; then
			bin=$dir
			break
		fi
	done
fi
if [ -z "$bin" ]; then
	cargo build --locked -q --bin dtf-ps --bin dtf-worker --bin dtf-evaluator
	bin=target/debug
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The token is a Secret in the cluster; a stand-in here.
head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$tmp/token"
chmod 600 "$tmp/token"
export DTF_SECURITY__TOKEN_FILE="$tmp/token"

# check ROLE TASK CONFIG [TF_CONFIG]: the daemon's check-config passes.
check() {
	role=$1 task=$2 config=$3 tf=${4:-}
	if [ -n "$tf" ]; then
		out=$(TF_CONFIG=$tf "$bin/dtf-$role" -c "$config" check-config 2>&1) ||
			{ echo "$out"; fail "dtf-$role check-config -c $config with TF_CONFIG $tf"; }
	else
		out=$(env -u TF_CONFIG "$bin/dtf-$role" -c "$config" --task "$task" check-config 2>&1) ||
			{ echo "$out"; fail "dtf-$role --task $task check-config -c $config"; }
	fi
	echo "ok: dtf-$role task $task: $config${tf:+ (TF_CONFIG)}${DTF_SECURITY__TLS_CERT:+ (TLS: scripts/make-tls-cert.sh)}"
}
k=deploy/kubernetes
check ps 0 $k/dtf.toml
check worker 0 $k/dtf.toml
check worker 1 $k/dtf.toml
check evaluator 0 $k/dtf.toml
# Mutual TLS with scripts/make-tls-cert.sh's certificate: dtf checks it as
# the other tasks' handshakes will (dates, the chain to the CA, a client
# certificate's usage) and that the key is the certificate's.
scripts/make-tls-cert.sh --ps 1 "$tmp/tls" >/dev/null || fail "scripts/make-tls-cert.sh"
export DTF_SECURITY__TLS_CERT="$tmp/tls/tls.crt" DTF_SECURITY__TLS_KEY="$tmp/tls/tls.key" \
	DTF_SECURITY__TLS_CA="$tmp/tls/ca.crt"
check ps 0 $k/dtf.toml
check worker 0 $k/dtf.toml
unset DTF_SECURITY__TLS_CERT DTF_SECURITY__TLS_KEY DTF_SECURITY__TLS_CA
# As the Training Operator writes it (pkg/controller.v1/tensorflow/tensorflow.go):
# every replica type's list, the task, and "environment".
cluster='"cluster":{"ps":["dtf-ps-0.dtf.svc:2222"],"chief":["dtf-chief-0.dtf.svc:2222"],"worker":["dtf-worker-0.dtf.svc:2222"],"evaluator":["dtf-evaluator-0.dtf.svc:2222"]}'
for task in ps:0 chief:0 worker:0 evaluator:0; do
	type=${task%:*}
	role=$type
	[ "$type" = chief ] && role=worker
	check "$role" "$type ${task#*:}" $k/tfjob/dtf.toml \
		"{$cluster,\"task\":{\"type\":\"$type\",\"index\":${task#*:}},\"environment\":\"cloud\"}"
done

echo "check-deploy: OK"
