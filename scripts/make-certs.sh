#!/usr/bin/env bash
# make-certs.sh DIR [NAME [HOST...]]: a CA (once) and a certificate NAME signed by it.
#
# DIR/ca.crt, DIR/ca.key: the cluster's CA, made when missing (10 years).
# DIR/NAME.crt, DIR/NAME.key: a certificate for TLS servers and clients, its
# subjectAltName every HOST (an IP address or a DNS name); made again when
# asked. Default NAME: server; default HOSTs: 127.0.0.1 ::1 localhost.
# A client certificate (DIR/client.crt, .key: what workers show Redis) is
# made too when missing. Keys are written owner-only; DIR is created 0700.
# Needs openssl (Debian).
set -euo pipefail
dir=${1:?usage: make-certs.sh DIR [NAME [HOST...]]}
name=${2:-server}
shift $(( $# > 2 ? 2 : $# ))
hosts=("$@")
[ ${#hosts[@]} -gt 0 ] || hosts=(127.0.0.1 ::1 localhost)
case "$name" in
    ca|*/*|'') echo "make-certs.sh: NAME must be a plain file name other than ca, got '$name'" >&2; exit 64 ;;
esac
command -v openssl >/dev/null || { echo "make-certs.sh: openssl is not installed (apt-get install openssl)" >&2; exit 69; }
umask 077
mkdir -p "$dir"
chmod 700 "$dir"
if [ ! -s "$dir/ca.crt" ] || [ ! -s "$dir/ca.key" ]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
        -subj "/CN=bloomcrawl CA $(hostname)" -keyout "$dir/ca.key" -out "$dir/ca.crt" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
        2>/dev/null
    echo "made $dir/ca.crt (the CA every host is given) and $dir/ca.key (keep it here)"
fi
san=""
for host in "${hosts[@]}"; do
    if [[ "$host" =~ ^[0-9.]+$ || "$host" == *:* ]]; then san+="IP:$host,"; else san+="DNS:$host,"; fi
done
san=${san%,}
ext=$(mktemp)
trap 'rm -f "$ext" "$dir/$name.csr"' EXIT
printf 'subjectAltName=%s\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n' "$san" >"$ext"
openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -subj "/CN=bloomcrawl $name" -keyout "$dir/$name.key" -out "$dir/$name.csr" 2>/dev/null
openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
    -days 825 -extfile "$ext" -out "$dir/$name.crt" 2>/dev/null
chmod 600 "$dir/$name.key"
chmod 644 "$dir/ca.crt" "$dir/$name.crt"
echo "made $dir/$name.crt and $dir/$name.key for ${hosts[*]}"
if [ "$name" != client ] && [ ! -s "$dir/client.crt" ]; then
    "$0" "$dir" client
fi
