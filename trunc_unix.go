//go:build !windows

package cidroute

import "syscall"

// msgTrunc is the receive flag that reports a datagram larger than the
// buffer.
const msgTrunc = syscall.MSG_TRUNC
