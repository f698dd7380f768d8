"""A seccomp filter that forbids new user namespaces, for the sandbox started by a service
running as root (:mod:`.sandbox`): bwrap then makes no user namespace of its own, so its
``--disable-userns`` is not available, and this filter (bwrap's ``--seccomp``) takes its place.

The program is classic BPF, as the kernel reads it (``struct sock_filter``: 16-bit code,
8-bit true and false jumps, 32-bit operand). For the machine's own architecture it answers:

- ``clone3``: ``ENOSYS`` (its flags are in memory, out of a filter's reach; the C library
  then falls back to ``clone``);
- ``clone`` and ``unshare`` with ``CLONE_NEWUSER`` in their flags (the first argument):
  ``EPERM``; any other call: allowed.

A call of another architecture (a 32-bit call on x86-64, the x32 ABI) is ``ENOSYS``: nothing in
the sandbox needs one, and it would pass the checks above unseen. On an architecture not known
here :func:`program` returns None and no filter is used.
"""

from __future__ import annotations

import errno
import platform
import struct

#: The flag of clone and unshare that makes a user namespace.
CLONE_NEWUSER = 0x10000000
#: (audit architecture, clone, unshare, clone3) by ``platform.machine()``.
ARCHES: dict[str, tuple[int, int, int, int]] = {
    "x86_64": (0xC000003E, 56, 272, 435),
    "aarch64": (0xC00000B7, 220, 97, 435),
}
#: The x32 ABI's bit in an x86-64 system call number.
X32_BIT = 0x40000000

# BPF opcodes (linux/filter.h, linux/seccomp.h)
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JSET_K = 0x45
_RET_K = 0x06
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program(machine: str | None = None) -> bytes | None:
    """The filter for ``machine`` (default this one's), as the bytes bwrap's ``--seccomp``
    reads; None for an architecture not in :data:`ARCHES`."""
    arch = ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    audit, clone, unshare, clone3 = arch
    enosys = _ERRNO | errno.ENOSYS
    eperm = _ERRNO | errno.EPERM
    insns = [
        _insn(_LD_W_ABS, 0, 0, 4),  # 0: the call's architecture
        _insn(_JEQ_K, 1, 0, audit),  # 1: ours: on to 3
        _insn(_RET_K, 0, 0, enosys),  # 2: another one
        _insn(_LD_W_ABS, 0, 0, 0),  # 3: the call's number
        _insn(_JSET_K, 5, 0, X32_BIT),  # 4: x32 (x86-64 only): ENOSYS
        _insn(_JEQ_K, 4, 0, clone3),  # 5: ENOSYS
        _insn(_JEQ_K, 1, 0, unshare),  # 6: to the flags
        _insn(_JEQ_K, 0, 4, clone),  # 7: to the flags, else allowed
        _insn(_LD_W_ABS, 0, 0, 16),  # 8: the first argument (its low 32 bits)
        _insn(_JSET_K, 1, 2, CLONE_NEWUSER),  # 9: EPERM, else allowed
        _insn(_RET_K, 0, 0, enosys),  # 10
        _insn(_RET_K, 0, 0, eperm),  # 11
        _insn(_RET_K, 0, 0, _ALLOW),  # 12
    ]
    return b"".join(insns)
