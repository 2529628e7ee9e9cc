#!/bin/busybox sh
# /init of the dranet test VM's initramfs (cargo xtask vm-test): load the modules, mount the
# host root (read only) and the output dir over 9p, chroot into the host root and run the
# guest test script. Every verdict goes to the serial console as a VMTEST line.
/bin/busybox mkdir -p /sbin /usr/bin /usr/sbin
/bin/busybox --install -s
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
echo "VMINIT kernel $(uname -r)"
while read -r mod params; do
    insmod "$mod" $params || echo "VMINIT insmod $mod $params failed"
done < /modules.list
R=/mnt/root
fail() {
    echo "VMTEST FAIL boot 0s $*"
    echo "VMTEST END"
    poweroff -f
}
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144,cache=loose hostroot $R || fail "mount hostroot"
mount -t tmpfs tmpfs $R/run || fail "tmpfs /run"
mount -t tmpfs tmpfs $R/tmp || fail "tmpfs /tmp"
mkdir -p $R/tmp/out
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 out $R/tmp/out || fail "mount out"
mount -t proc proc $R/proc
mount -t sysfs sysfs $R/sys
mount -t devtmpfs devtmpfs $R/dev
mkdir -p $R/dev/pts $R/dev/shm
mount -t devpts devpts $R/dev/pts
mount -t tmpfs tmpfs $R/dev/shm
mount -t bpf bpf $R/sys/fs/bpf
mount -t tracefs tracefs $R/sys/kernel/tracing
mount -t debugfs debugfs $R/sys/kernel/debug
ip link set lo up 2>/dev/null
echo "VMINIT chroot"
chroot $R /bin/bash /tmp/out/guest-test.sh
echo "VMINIT guest script exited $?"
sync
umount $R/tmp/out
poweroff -f
