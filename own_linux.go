//go:build linux

package cidroute

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// watchHostAddrs calls changed after each change of the host's addresses
// until stop is closed. It listens to the kernel's address notifications
// (rtnetlink RTM_NEWADDR / RTM_DELADDR): an address the proxy gains is in
// its own-address set as soon as the notification is read, where a
// periodic interface scan would leave a window of a whole period in which
// a reply to it could start a loop. The messages only trigger a rescan
// (LocalAddrs), so none needs parsing and an overflow (ENOBUFS) is handled
// like any other notification. When the socket cannot be opened it falls
// back to scanning every hostScanInterval.
func watchHostAddrs(stop <-chan struct{}, changed func()) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_ROUTE)
	if err == nil {
		err = unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: unix.RTMGRP_IPV4_IFADDR | unix.RTMGRP_IPV6_IFADDR})
		if err != nil {
			unix.Close(fd)
		}
	}
	if err != nil {
		scanHostAddrs(stop, changed)
		return
	}
	// A non-blocking descriptor in an *os.File waits on the netpoller, so
	// closing it wakes the read.
	f := os.NewFile(uintptr(fd), "rtnetlink")
	done := make(chan struct{})
	go func() {
		select {
		case <-stop:
		case <-done:
		}
		f.Close()
	}()
	defer close(done)
	// An address that came or went between the caller's last scan (New)
	// and the bind above notified nobody: scan once now that nothing is
	// missed.
	changed()
	buf := make([]byte, 1<<16)
	for {
		_, err := f.Read(buf)
		select {
		case <-stop:
			return
		default:
		}
		if err != nil && !errors.Is(err, unix.ENOBUFS) {
			scanHostAddrs(stop, changed) // the socket failed: poll instead
			return
		}
		changed()
	}
}
