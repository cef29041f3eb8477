//go:build linux

package udpio

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

func unsafeIovs(h *mmsghdr) []unix.Iovec {
	return unsafe.Slice(h.Hdr.Iov, int(h.Hdr.Iovlen))
}

func unsafeBytes(v unix.Iovec) []byte { return unsafe.Slice(v.Base, int(v.Len)) }
