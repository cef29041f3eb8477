//go:build windows

package cidroute

// msgTrunc is the receive flag that reports a datagram larger than the
// buffer; Windows reports truncation as an error instead.
const msgTrunc = 0
