#!/usr/bin/env bash
# libvirt-host.sh runs a self-contained libvirtd "host" without systemd, so
# that tests and a developer machine can have several hypervisor hosts side
# by side on one machine and live-migrate QEMU guests between them.
#
#   libvirt-host.sh start NAME DIR [NETNS]   start the host, print its URI
#   libvirt-host.sh stop NAME DIR            destroy its guests, stop it
#   libvirt-host.sh uri NAME DIR             print the URI pinflow uses
#
# Everything the daemon writes lives under DIR: configuration (DIR/etc),
# runtime state and QEMU pid files (DIR/run, DIR/run/qemu/GUEST.pid),
# persistent domain definitions (DIR/lib), the QEMU capability cache
# (DIR/cache), logs (DIR/log, DIR/libvirtd.log) and the client socket
# (DIR/sock/libvirt-sock). The daemon runs in its own mount and UTS
# namespaces: its hostname is NAME and libvirt's fixed paths are bind
# mounts of DIR's subdirectories, so the machine's /etc and /var are never
# written (only empty mount points are created). NETNS, when given, is an
# existing network namespace (ip netns) the daemon and its guests run in.
#
# Needs root: libvirt's QEMU driver runs guests as root here, without
# cgroups, namespaces or a security driver, because the hosts share one
# kernel and are for testing. Needs libvirtd, qemu-system-x86_64 and
# unshare; virsh is used on stop when present.
set -euo pipefail

usage() {
	echo "usage: $0 start NAME DIR [NETNS] | stop NAME DIR | uri NAME DIR" >&2
	exit 2
}

[ $# -ge 3 ] || usage
cmd=$1 name=$2 dir=$3 netns=${4:-}
case "$name" in
'' | *[!A-Za-z0-9._-]*)
	echo "libvirt-host: host name '$name' is invalid; use letters, digits, '.', '_' and '-'" >&2
	exit 2
	;;
esac
case "$dir" in
*"'"*)
	echo "libvirt-host: directory '$dir' must not contain a single quote" >&2
	exit 2
	;;
esac
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
sock=$dir/sock/libvirt-sock
uri="qemu+unix:///system?socket=$sock"
pidfile=$dir/libvirtd.pid

# alive PID: whether the process exists and is not a zombie. Its status
# is read once: a process reaped between two reads is gone, not alive.
alive() {
	local state
	state=$(grep '^State:' "/proc/$1/status" 2>/dev/null) || return 1
	[[ $state != *Z* ]]
}

# qemu_pids: the live guests this host started, from libvirt's pid files.
# A pid file can outlive its process after a crash, so only pids that still
# run a QEMU binary count.
qemu_pids() {
	local f p
	for f in "$dir"/run/qemu/*.pid; do
		[ -f "$f" ] || continue
		p=$(cat "$f")
		case "$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)" in
		*qemu-system*) echo "$p" ;;
		esac
	done
	return 0
}

start() {
	# The unix socket path must fit sockaddr_un (108 bytes with the NUL).
	if [ ${#sock} -gt 107 ]; then
		echo "libvirt-host: socket path $sock is ${#sock} bytes; at most 107 fit, use a shorter DIR" >&2
		exit 2
	fi
	if [ -f "$pidfile" ] && alive "$(cat "$pidfile")"; then
		echo "libvirt-host: $name already runs in $dir (pid $(cat "$pidfile"))" >&2
		exit 1
	fi
	for bin in libvirtd qemu-system-x86_64 unshare; do
		command -v "$bin" >/dev/null || {
			echo "libvirt-host: $bin is not installed" >&2
			exit 1
		}
	done
	mkdir -p "$dir"/{etc,run,lib,cache,log,sock}
	rm -f "$dir"/sock/* "$pidfile"

	# libvirt refuses to migrate between two hosts with the same host UUID,
	# so derive a stable, distinct one from the host name.
	local h host_uuid
	h=$(printf '%s' "$name" | sha256sum)
	host_uuid="${h:0:8}-${h:8:4}-${h:12:4}-${h:16:4}-${h:20:12}"
	# Hosts on one machine would race for libvirt's default migration
	# ports (each daemon checks a port is free, then QEMU binds it), so
	# each takes eight of its own, picked by its directory, from 10000 to
	# 15999: below the kernel's ephemeral ports (32768 up), which any
	# connection may hold for a moment, and below the test servers' ports
	# (20000 up) and the dev stacks' (16379 up).
	local d migration_port
	d=$(printf '%s' "$dir" | sha256sum)
	migration_port=$((10000 + (16#${d:0:4} % 750) * 8))

	cat >"$dir/etc/libvirtd.conf" <<EOF
# Written by pinflow's deploy/libvirt-host.sh for host $name.
unix_sock_dir = "$dir/sock"
unix_sock_rw_perms = "0770"
auth_unix_rw = "none"
auth_unix_ro = "none"
listen_tls = 0
listen_tcp = 0
host_uuid = "$host_uuid"
log_outputs = "2:file:$dir/libvirtd.log"
EOF
	# Guests run as root with no cgroups, private namespaces or security
	# labels: several hosts share this machine, and none of those can be
	# set up per host without systemd. Console output goes to files, so no
	# virtlogd is needed.
	cat >"$dir/etc/qemu.conf" <<EOF
# Written by pinflow's deploy/libvirt-host.sh for host $name.
user = "root"
group = "root"
dynamic_ownership = 0
remember_owner = 0
namespaces = [ ]
cgroup_controllers = [ ]
security_driver = "none"
stdio_handler = "file"
migration_port_min = $migration_port
migration_port_max = $((migration_port + 7))
EOF
	if [ -f /etc/libvirt/libvirt.conf ] && [ ! -f "$dir/etc/libvirt.conf" ]; then
		cp /etc/libvirt/libvirt.conf "$dir/etc/"
	fi

	# The privileged QEMU driver looks up its built-in user libvirt-qemu at
	# start, before reading qemu.conf. Without the libvirt-daemon-system
	# package that user does not exist, so the namespace gets its own
	# passwd and group files that have it.
	cp /etc/passwd "$dir/passwd"
	cp /etc/group "$dir/group"
	grep -q '^libvirt-qemu:' "$dir/passwd" ||
		echo 'libvirt-qemu:x:64055:64055:Libvirt Qemu:/var/lib/libvirt:/usr/sbin/nologin' >>"$dir/passwd"
	grep -q '^libvirt-qemu:' "$dir/group" || echo 'libvirt-qemu:x:64055:' >>"$dir/group"

	# Runs inside the new namespaces: hostname, bind mounts, then libvirtd
	# in place of the shell, so the pid file names the daemon itself.
	local inner
	inner="set -e
hostname '$name'
for d in /run/libvirt /etc/libvirt /var/lib/libvirt /var/cache/libvirt /var/log/libvirt; do mkdir -p \$d; done
mount --bind '$dir/run' /run/libvirt
mount --bind '$dir/etc' /etc/libvirt
mount --bind '$dir/lib' /var/lib/libvirt
mount --bind '$dir/cache' /var/cache/libvirt
mount --bind '$dir/log' /var/log/libvirt
mount --bind '$dir/passwd' /etc/passwd
mount --bind '$dir/group' /etc/group
exec libvirtd --config '$dir/etc/libvirtd.conf' --pid-file '$pidfile'"
	local launch=(unshare --mount --uts --propagation private sh -c "$inner")
	if [ -n "$netns" ]; then
		launch=(ip netns exec "$netns" "${launch[@]}")
	fi
	# setsid detaches the daemon from the caller's session and terminal.
	setsid "${launch[@]}" >"$dir/stdout.log" 2>&1 </dev/null &

	local i
	for i in $(seq 1 300); do
		[ -S "$sock" ] && break
		if ! alive $! && [ ! -S "$sock" ]; then
			break
		fi
		sleep 0.1
	done
	if [ ! -S "$sock" ]; then
		echo "libvirt-host: libvirtd for $name did not create $sock" >&2
		cat "$dir/stdout.log" >&2 || true
		tail -n 20 "$dir/libvirtd.log" >&2 2>/dev/null || true
		exit 1
	fi
	echo "$uri"
}

stop() {
	local pid="" p i
	# Destroy the guests through the daemon first, so that it records them
	# as shut off and a later start of this host does not find stale ones.
	if [ -S "$sock" ] && command -v virsh >/dev/null; then
		for g in $(timeout 30 virsh -q -c "$uri" list --name 2>/dev/null || true); do
			timeout 30 virsh -q -c "$uri" destroy "$g" >/dev/null 2>&1 || true
		done
	fi
	if [ -f "$pidfile" ]; then
		pid=$(cat "$pidfile")
	fi
	if [ -n "$pid" ] && alive "$pid"; then
		kill -TERM "$pid" 2>/dev/null || true
		for i in $(seq 1 100); do
			alive "$pid" || break
			sleep 0.1
		done
		kill -KILL "$pid" 2>/dev/null || true
	fi
	# QEMU outlives libvirtd by design; a guest left behind would keep the
	# namespace, its mounts and DIR busy.
	for p in $(qemu_pids); do
		kill -KILL "$p" 2>/dev/null || true
	done
	# A killed process always exits, but on a loaded machine one busy in
	# the kernel (freeing a guest's memory, closing its files) takes its
	# time: wait for it, and say where it hangs if it never goes.
	for p in $pid $(qemu_pids); do
		for i in $(seq 1 3000); do
			alive "$p" || break
			sleep 0.1
		done
		if alive "$p"; then
			echo "libvirt-host: process $p of $name did not exit within 5 minutes of SIGKILL:" \
				"$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)," \
				"$(grep -E '^(State|Threads):' "/proc/$p/status" 2>/dev/null | tr '\n\t' '  ')" \
				"wchan $(cat "/proc/$p/wchan" 2>/dev/null)" >&2
			exit 1
		fi
	done
	rm -f "$dir"/sock/* "$pidfile"
}

case "$cmd" in
start) start ;;
stop) stop ;;
uri) echo "$uri" ;;
*) usage ;;
esac
