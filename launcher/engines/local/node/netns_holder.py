"""The holder of a local run's private network namespace (stdlib only: run as a script, ``python -S netns_holder.py``).

It leaves the launcher's network namespace (``unshare``; as an ordinary user also into a user
namespace of its own that maps only the user's own uid and gid, so nothing changes for the
tasks but the network), brings that namespace's loopback up, says ``ok`` on stdout and then
waits on stdin: when the launcher closes its end, or dies, the holder exits. The tasks join
its namespace with ``nsenter --target PID`` (the namespace lives as long as any of them does).

Why a process of its own and not ``ip netns add``: a named namespace is a mount under
/run/netns that outlives a launcher killed with SIGKILL; a holder cannot.
"""

import ctypes
import errno
import fcntl
import os
import socket
import struct
import sys

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
DENY_FOR_TESTS = "TFL_TEST_DENY_NETNS"  # tests only: behave as a kernel that forbids namespaces


def _unshare(flags: int) -> int:
    if os.environ.get(DENY_FOR_TESTS) == "1":
        return errno.EPERM
    libc = ctypes.CDLL(None, use_errno=True)
    return 0 if libc.unshare(flags) == 0 else ctypes.get_errno()


def _map_self(uid: int, gid: int) -> None:
    """Only the user's own ids, mapped to themselves: the tasks keep their uid and gid."""
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sH", fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sH", b"lo", 0)))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | IFF_UP))


def main() -> int:
    uid, gid = os.getuid(), os.getgid()
    user_ns = uid != 0
    failure = _unshare(CLONE_NEWNET) if not user_ns else errno.EPERM
    if failure:  # an ordinary user, or root without CAP_SYS_ADMIN (a container): a user namespace too
        user_ns = True
        failure = _unshare(CLONE_NEWUSER | CLONE_NEWNET)
    if failure:
        print(f"error unshare: {os.strerror(failure)}", flush=True)
        return 3
    try:
        if user_ns:
            _map_self(uid, gid)
        _loopback_up()
    except OSError as exc:
        print(f"error {exc}", flush=True)
        return 3
    print(f"ok {'user' if user_ns else 'net'}", flush=True)
    sys.stdout.close()
    while sys.stdin.buffer.read(4096):  # until the launcher closes its end or dies
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
