// Command loadgen drives a UDP proxy with DTLS- and QUIC-shaped datagrams
// and measures what comes back: offered and received rate, loss, and
// round-trip time percentiles. It is the client side of the forwarding
// benchmark in bench/.
//
// Each datagram is a DTLS 1.2 tls12_cid record, a DTLS ClientHello, a
// QUIC short header or random bytes that a DTLS service drops (-mix), carrying a connection ID with one of the
// configured backend ordinals (-ordinals), and ends with a 24-byte stamp
// (run, sequence number, send time) that an echo backend returns
// unchanged. Datagrams go out and come back in recvmmsg/sendmmsg batches.
//
// -clients sets the number of distinct client addresses. Beyond -sockets,
// each client gets its own loopback source address (127.1.x.y, set per
// datagram with IP_PKTINFO) on a shared socket, so ten thousand clients
// cost loadgen a handful of file descriptors.
//
// With -rate, datagrams are paced evenly from the start, in bursts of at
// most -batch at the timer's resolution; without it, loadgen sends flat
// out with at most -window datagrams in flight per socket (a closed loop,
// so the forwarder's capacity shows as rate, not as loss). Both are open
// loop past capacity only with -rate or -open: -open sends flat out
// whatever comes back, one sender per socket, so -sockets N offers N
// senders' worth in parallel; several loadgen processes add up, and a
// flood of junk is one with -mix random or -ordinals naming an ordinal no
// backend has.
//
// It sends for -warmup, then measures for -duration, waits at most -drain
// for the last replies and exits. It refuses a target that is not a
// loopback address unless -allow-remote is given. -watch-pid and
// -watch-allocs sample the forwarder's CPU time, RSS, open files and heap
// allocations at the edges of the measured window; -json prints the
// result for scripts.
//
//	loadgen -target 127.0.0.1:5684 -rate 50000 -clients 1000 -duration 5s
package main
