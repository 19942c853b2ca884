#!/bin/sh
# The certificate of deploy/kubernetes's mutual TLS (docs/deploy.md, "TLS on
# Kubernetes"): a CA, and one certificate and key that every ps, the chief
# and the workers share (the Secret dtf-tls):
#
#   scripts/make-tls-cert.sh [--namespace NS] [--ps N] [--cluster-domain D]
#                            [--days N] [DIR]
#
# Defaults: namespace dtf, 1 ps, cluster domain cluster.local, 365 days (the
# CA: 10 years). DIR (default deploy/kubernetes/secrets, where kustomization.yaml's
# secretGenerator reads them) gets ca.crt, tls.crt, tls.key, and ca.key,
# which signs and stays out of the cluster. A CA already in DIR (ca.crt and
# ca.key) is kept, so a new certificate (more ps tasks) is trusted by pods
# that still hold the old one.
#
# Its subjectAltName lists each ps's name as dtf.toml dials it,
# dtf-ps-<i>.dtf-ps, and the same name qualified,
# dtf-ps-<i>.dtf-ps.<NS>.svc and dtf-ps-<i>.dtf-ps.<NS>.svc.<D>, for i in
# 0..N-1: a worker (or ps, or dtf status) checks that the ps's certificate
# names the host it dialled. A wildcard (*.dtf-ps) would not do: rustls, as
# browsers, takes a wildcard only with at least two labels after it. Give N above
# the ps tasks you run to scale without a new certificate. The ps checks no
# client name, only the chain to the CA: the chief's and the workers' own
# names need no entry. Extended key usage serverAuth and clientAuth: each
# pod presents it as a server (ps) and as a client (worker, and a ps copying
# its snapshots to the next).
set -eu

namespace=dtf ps=1 domain=cluster.local days=365 dir=
# usage STATUS: the synopsis above, on stderr unless STATUS is 0.
usage() {
	if [ "$1" = 0 ]; then
		sed -n '/^#   scripts/,/^#  *\[--days/p' "$0" | sed 's/^#   //'
	else
		sed -n '/^#   scripts/,/^#  *\[--days/p' "$0" | sed '1s/^#   /usage: /; 2,$s/^#   /       /' >&2
	fi
	exit "$1"
}
while [ $# -gt 0 ]; do
	case $1 in
	--namespace) namespace=${2:?}; shift 2 ;;
	--ps) ps=${2:?}; shift 2 ;;
	--cluster-domain) domain=${2:?}; shift 2 ;;
	--days) days=${2:?}; shift 2 ;;
	-h | --help) usage 0 ;;
	-*) echo "make-tls-cert: unknown option $1" >&2; usage 2 ;;
	*) [ -z "$dir" ] || usage 2; dir=$1; shift ;;
	esac
done
case $ps in '' | *[!0-9]* | 0) echo "make-tls-cert: --ps $ps: expected a count of ps tasks, 1 or more" >&2; exit 2 ;; esac
case $days in '' | *[!0-9]* | 0) echo "make-tls-cert: --days $days: expected a number of days" >&2; exit 2 ;; esac
# A DNS label (RFC 1123), as Kubernetes requires of a namespace.
if ! printf '%s' "$namespace" | grep -Eqx '[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?'; then
	echo "make-tls-cert: --namespace $namespace: not a Kubernetes namespace name" >&2
	exit 2
fi
[ -n "$dir" ] || dir="$(dirname "$0")/../deploy/kubernetes/secrets"
command -v openssl >/dev/null || { echo "make-tls-cert: openssl is not installed" >&2; exit 1; }
mkdir -p "$dir"
umask 077
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ -f "$dir/ca.crt" ] && [ -f "$dir/ca.key" ]; then
	echo "make-tls-cert: keeping the CA in $dir"
elif [ -f "$dir/ca.crt" ] || [ -f "$dir/ca.key" ]; then
	# A new CA would leave the pods that trust the old one refusing this
	# certificate; one half of a CA cannot sign.
	echo "make-tls-cert: $dir holds only one of ca.crt and ca.key: give both (to keep the CA) or neither (for a new one)" >&2
	exit 1
else
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
		-subj "/CN=dtf CA ($namespace)" \
		-addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
		-addext "keyUsage=critical,keyCertSign,cRLSign" \
		-keyout "$dir/ca.key" -out "$dir/ca.crt" 2>"$work/err" || { cat "$work/err" >&2; exit 1; }
fi

sans=
i=0
while [ $i -lt "$ps" ]; do
	name=dtf-ps-$i.dtf-ps
	sans="$sans${sans:+,}DNS:$name,DNS:$name.$namespace.svc,DNS:$name.$namespace.svc.$domain"
	i=$((i + 1))
done
cat >"$work/ext" <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth,clientAuth
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid
subjectAltName=$sans
EOF
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=dtf ($namespace)" \
	-keyout "$work/tls.key" -out "$work/tls.csr" 2>"$work/err" || { cat "$work/err" >&2; exit 1; }
openssl x509 -req -in "$work/tls.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -set_serial "0x$(openssl rand -hex 16)" \
	-days "$days" -extfile "$work/ext" -out "$work/tls.crt" 2>"$work/err" || { cat "$work/err" >&2; exit 1; }
mv "$work/tls.key" "$dir/tls.key"
mv "$work/tls.crt" "$dir/tls.crt"
chmod 644 "$dir/ca.crt" "$dir/tls.crt"

echo "make-tls-cert: $dir/tls.crt for $ps ps task(s) in namespace $namespace, valid $days days:"
echo "  $(echo "$sans" | sed 's/,/ /g')"
echo "Keep $dir/ca.key out of the cluster. Then either uncomment the dtf-tls"
echo "secretGenerator in deploy/kubernetes/kustomization.yaml (it reads secrets/),"
echo "or leave it commented and create the Secret yourself:"
echo "  kubectl -n $namespace create secret generic dtf-tls --from-file=ca.crt=$dir/ca.crt \\"
echo "      --from-file=tls.crt=$dir/tls.crt --from-file=tls.key=$dir/tls.key"
echo "and enable patches/tls*.yaml in kustomization.yaml and the tls_* keys in dtf.toml."
