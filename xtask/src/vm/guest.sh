#!/bin/sh
# Stage two of the guest, on the host's root under a tmpfs overlay: the mounts a test
# host has, this kernel's modules where modprobe looks for them, then each test binary
# in turn. Everything goes to the console, which `cargo xtask vm-test` reads; its lines
# that start with `vm-test:` are the protocol between the two.
# From the initramfs: /vm-test/env (MODULES, TESTS_DIR, BIN_TIMEOUT, NOFILE and the
# tests' environment), /vm-test/binaries (`NAME PATH` a line) and /vm-test/args (one argument
# a line, given to every binary: a test filter).
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs shm /dev/shm
mount -t tmpfs run /run
mount -t bpf bpf /sys/fs/bpf
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
hostname vm-test

. /vm-test/env
# modprobe (the kernel runs it for `ip link add ... type veth`) reads
# /lib/modules/$(uname -r), which the host's root does not have for this kernel.
release=$(uname -r)
mkdir -p /lib/modules
rm -rf "/lib/modules/$release"
ln -s "$MODULES" "/lib/modules/$release"
ip link set lo up
# The host's open-file limits (NOFILE is `soft:hard`), hard first.
ulimit -Hn "${NOFILE#*:}"
ulimit -Sn "${NOFILE%:*}"

set --
while IFS= read -r arg; do
    set -- "$@" "$arg"
done </vm-test/args

echo "vm-test: guest up: $(uname -rv)"
cd "$TESTS_DIR" || echo "vm-test: no folder $TESTS_DIR"
while read -r name path; do
    echo "vm-test: run $name"
    timeout --kill-after=20 "$BIN_TIMEOUT" "$path" "$@" </dev/null 2>&1
    echo "vm-test: exit $name $?"
done </vm-test/binaries
echo "vm-test: done"
echo o >/proc/sysrq-trigger
sleep 60
