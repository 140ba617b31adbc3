#!/usr/bin/env bash
# Installs what pinflow's tests and dev stack need when it is missing:
# Debian packages (redis-server, libvirt tools) and the Temporal CLI, built
# from the Go module proxy into bin/. Safe to run again; does nothing when
# everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."

TEMPORAL_CLI_VERSION=${TEMPORAL_CLI_VERSION:-v1.5.1}

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

if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "deps: installing ${need_pkgs[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "deps: need root to install ${need_pkgs[*]} (or install them yourself)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi

mkdir -p bin
if [ "${PINFLOW_NEED_TEMPORAL:-1}" = 1 ] && ! have temporal && [ ! -x bin/temporal ]; then
  echo "deps: building the Temporal CLI $TEMPORAL_CLI_VERSION into bin/ (about 10 minutes the first time)"
  GOBIN="$PWD/bin" go install "github.com/temporalio/cli/cmd/temporal@$TEMPORAL_CLI_VERSION"
fi
