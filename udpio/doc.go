// Package udpio moves UDP datagrams in batches: recvmmsg and sendmmsg on
// Linux, with every kernel structure allocated once per Conn and reused, and
// a portable one-datagram-per-syscall fallback with the same API elsewhere.
//
// A Conn wraps a *net.UDPConn. ReadBatch fills caller-owned Message buffers
// and reports each datagram's source (and, with packet info, its
// destination) as netip values; WriteBatch sends each message as an optional
// prefix (a PROXY protocol header, say) plus a payload in one datagram,
// without joining them. Neither allocates in steady state. A would-block
// parks the goroutine on Go's netpoller: no spinning, no OS thread held.
//
// ListenGroup opens N SO_REUSEPORT sockets on one address, one per worker
// goroutine, and refuses to share the address with sockets it did not open
// (another instance started by mistake) unless ListenConfig.JoinExisting
// asks to join them, as the new process of a restart handover does. AttachSteering adds a classic BPF program that delivers each
// DTLS 1.2 or QUIC datagram to the socket named by the ordinal byte of its
// connection ID, so a server running one DTLS listener or quic-go Transport
// per socket receives every packet of a session on the socket that owns it.
//
// udpio imports nothing else of cidroute; a CIDCodec's Len and OrdinalOffset
// fill Steering. An encrypted codec (quic.LBEncrypted) has no ordinal byte
// in the clear and reports OrdinalOffset -1, which AttachSteering refuses
// with ErrNoOrdinalByte.
package udpio
