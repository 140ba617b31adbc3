#!/usr/bin/env bash
# Installs what pinflow's tests and dev stack need when it is missing:
# Debian packages (redis-server, libvirt tools, PostgreSQL) and the Temporal
# CLI, server and SQL tool, built from the Go module proxy into bin/. Safe
# to run again; does nothing when everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."

TEMPORAL_CLI_VERSION=${TEMPORAL_CLI_VERSION:-v1.5.1}
# The server of the distributed deployment (deploy/cluster.sh); its schema
# files come from the same module.
TEMPORAL_SERVER_VERSION=${TEMPORAL_SERVER_VERSION:-v1.29.1}

need_pkgs=()
have() { command -v "$1" >/dev/null 2>&1; }
have redis-server || need_pkgs+=(redis-server)
have redis-cli || need_pkgs+=(redis-tools)
have virt-xml-validate || need_pkgs+=(libvirt-clients)
have xmllint || need_pkgs+=(libxml2-utils)
# Real libvirt "hosts" for the libvirt driver's tests: libvirtd with the
# QEMU driver, and QEMU for software-emulated guests.
have libvirtd || need_pkgs+=(libvirt-daemon libvirt-daemon-driver-qemu)
have qemu-system-x86_64 || need_pkgs+=(qemu-system-x86)
have virsh || need_pkgs+=(libvirt-clients)
# Nova's own validators answer numa's extra-spec oracle test on fresh cases.
/usr/bin/python3 -c 'import nova.api.validation.extra_specs.validators' >/dev/null 2>&1 || need_pkgs+=(python3-nova)
# make test-stress keeps every core busy with it while the suite runs.
have stress-ng || need_pkgs+=(stress-ng)
# deploy/cluster.sh keeps Temporal's state in a private PostgreSQL.
if [ "${PINFLOW_NEED_CLUSTER:-1}" = 1 ] && ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
  need_pkgs+=(postgresql)
fi

# WAITAOF (local fsync acknowledgements) needs Redis 7.2; where Debian's
# redis-server is older (bookworm has 7.0), the durability tests run it on
# valkey-server, which bookworm has in its backports.
redis_has_waitaof() {
  local v
  v=$(redis-server --version 2>/dev/null | sed -n 's/.*v=\([0-9]*\)\.\([0-9]*\).*/\1 \2/p')
  [ -n "$v" ] && set -- $v && { [ "$1" -gt 7 ] || { [ "$1" -eq 7 ] && [ "$2" -ge 2 ]; }; }
}
need_valkey=0
if ! have valkey-server && ! { have redis-server && redis_has_waitaof; }; then
  need_valkey=1
fi

if [ ${#need_pkgs[@]} -gt 0 ] || [ $need_valkey = 1 ]; then
  [ ${#need_pkgs[@]} -eq 0 ] || echo "deps: installing ${need_pkgs[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "deps: need root to install ${need_pkgs[*]} (or install them yourself)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  if [ $need_valkey = 1 ] && [ "$(. /etc/os-release && echo "${VERSION_CODENAME:-}")" = bookworm ] &&
    [ ! -e /etc/apt/sources.list.d/bookworm-backports.sources ]; then
    printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
      >/etc/apt/sources.list.d/bookworm-backports.sources
  fi
  apt-get update -qq
  if [ ${#need_pkgs[@]} -gt 0 ]; then
    apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
  fi
  if [ $need_valkey = 1 ]; then
    echo "deps: installing valkey-server (WAITAOF, for the durability tests)"
    if apt-cache policy valkey-server | grep -q bookworm-backports; then
      apt-get install -y -qq --no-install-recommends -t bookworm-backports valkey-server >/dev/null
    else
      apt-get install -y -qq --no-install-recommends valkey-server >/dev/null
    fi
  fi
fi

mkdir -p bin
if [ "${PINFLOW_NEED_TEMPORAL:-1}" = 1 ] && ! have temporal && [ ! -x bin/temporal ]; then
  echo "deps: building the Temporal CLI $TEMPORAL_CLI_VERSION into bin/ (about 10 minutes the first time)"
  GOBIN="$PWD/bin" go install "github.com/temporalio/cli/cmd/temporal@$TEMPORAL_CLI_VERSION"
fi
# The Temporal server and its SQL schema tool for deploy/cluster.sh; go
# install names them server and sql, too plain for bin/.
if [ "${PINFLOW_NEED_CLUSTER:-1}" = 1 ]; then
  for tool in server:cmd/server sql-tool:cmd/tools/sql; do
    name=temporal-${tool%%:*} pkg=go.temporal.io/server/${tool#*:}
    [ ! -x "bin/$name" ] || continue
    echo "deps: building $name $TEMPORAL_SERVER_VERSION into bin/ (a few minutes the first time)"
    rm -rf bin/.build && mkdir bin/.build
    GOBIN="$PWD/bin/.build" go install "$pkg@$TEMPORAL_SERVER_VERSION"
    mv "bin/.build/${pkg##*/}" "bin/$name" && rm -rf bin/.build
  done
fi
