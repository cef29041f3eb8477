package cidroute

// A CIDCodec is the layout of the connection IDs a service's backends issue:
// where the ordinal sits and how long the CID is. The proxy decodes CIDs with
// it; backends encode fresh CIDs with it. The built-in codecs are
// dtls.OrdinalFirst (DTLS default), quic.LB (QUIC-LB plaintext, QUIC
// default) and quic.LBEncrypted (QUIC-LB encrypted, with key rotation);
// all are usable for either protocol.
//
// Implementations must be safe for concurrent use.
type CIDCodec interface {
	// Len is the fixed length of every CID of the service.
	Len() int
	// AppendCID appends a fresh CID that carries ordinal (0–254) to dst.
	AppendCID(dst []byte, ordinal uint8) ([]byte, error)
	// Ordinal decodes the ordinal from a CID of length Len. ok is false when
	// the codec marks the CID as not routable (QUIC-LB's 0b111 config
	// rotation), in which case the router falls back to hashing the client
	// address. A decoded 255 is reserved and never routed.
	Ordinal(cid []byte) (ordinal uint8, ok bool)
	// OrdinalOffset is the byte offset of the ordinal inside the CID, for
	// kernel steering that cannot run Go code (udpio.Steering). It is
	// negative when no octet holds the ordinal in the clear (an encrypted
	// codec): such a codec cannot be used for kernel steering, and
	// udpio.AttachSteering refuses it.
	OrdinalOffset() int
}
