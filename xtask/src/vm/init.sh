#!/bin/busybox sh
# Stage one of the guest, from the initramfs `cargo xtask vm-test` writes: load the
# modules the root needs, mount the host's root read-only over virtio-9p under a tmpfs
# overlay, and hand over to stage two (guest.sh) there.
/bin/busybox --install -s /bin
export PATH=/bin
mkdir -p /proc /sys /dev /lower /rw /newroot
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

fail() {
    echo "vm-test: stage one: $*"
    echo o >/proc/sysrq-trigger
    sleep 60
}

# `vmprobe` on the kernel command line (it reaches init's environment): only show that
# the guest runs, for the check of whether KVM works here.
if [ -n "$vmprobe" ]; then
    echo "vm-test: probe ok"
    echo o >/proc/sysrq-trigger
    sleep 60
fi

while read -r module; do
    insmod "/modules/$module" || fail "insmod $module failed"
done </modules/order

mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose hostroot /lower ||
    fail "cannot mount the host's root (virtio-9p tag hostroot)"
mount -t tmpfs -o mode=0755 rw /rw
mkdir /rw/upper /rw/work
mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay /newroot ||
    fail "cannot mount the overlay root"
mkdir -p /newroot/vm-test
cp /guest.sh /env /binaries /args /newroot/vm-test/
chmod 0755 /newroot/vm-test/guest.sh
umount /proc /sys /dev
exec switch_root /newroot /vm-test/guest.sh
