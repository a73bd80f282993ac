package tracer

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

func getsockoptUint64(fd, level, opt int) (uint64, error) {
	var v uint64
	l := uint32(unsafe.Sizeof(v))
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt),
		uintptr(unsafe.Pointer(&v)), uintptr(unsafe.Pointer(&l)), 0)
	if errno != 0 {
		return 0, errno
	}
	return v, nil
}
