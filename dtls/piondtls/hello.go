package piondtls

import "github.com/cidroute/cidroute/dtls"

const (
	typeServerHello    = 2
	extConnectionID    = 54 // RFC 9146
	handshakeHeaderLen = 12 // msg_type(1) length(3) message_seq(2) fragment_offset(3) fragment_length(3)
)

// serverHelloCID returns the connection ID a server tells its peer to use,
// from the connection_id extension of a ServerHello in the outgoing
// datagram b: the CID the client's tls12_cid records will carry. It reads
// only unfragmented epoch-0 ServerHellos (pion sends it whole and first in
// its flight). The result is a view into b.
func serverHelloCID(b []byte) ([]byte, bool) {
	for len(b) > 0 {
		r, n, err := dtls.ParseRecord(b, dtls.MinCIDLen) // a server's records carry no CID of ours
		if err != nil {
			return nil, false
		}
		b = b[n:]
		if r.Type != dtls.Handshake || r.Epoch != 0 {
			continue
		}
		if cid, ok := helloCID(r.Fragment); ok {
			return cid, true
		}
	}
	return nil, false
}

func helloCID(f []byte) ([]byte, bool) {
	if len(f) < handshakeHeaderLen || f[0] != typeServerHello {
		return nil, false
	}
	length := int(f[1])<<16 | int(f[2])<<8 | int(f[3])
	off := int(f[6])<<16 | int(f[7])<<8 | int(f[8])
	flen := int(f[9])<<16 | int(f[10])<<8 | int(f[11])
	if off != 0 || flen != length || len(f) < handshakeHeaderLen+length {
		return nil, false
	}
	m := f[handshakeHeaderLen : handshakeHeaderLen+length]
	// version(2) random(32) session_id<0..32> cipher_suite(2) compression(1)
	p := 2 + 32
	if len(m) < p+1 {
		return nil, false
	}
	p += 1 + int(m[p])
	p += 2 + 1
	if len(m) < p+2 {
		return nil, false
	}
	end := p + 2 + (int(m[p])<<8 | int(m[p+1]))
	if end > len(m) {
		return nil, false
	}
	for p += 2; p+4 <= end; {
		typ := int(m[p])<<8 | int(m[p+1])
		l := int(m[p+2])<<8 | int(m[p+3])
		p += 4
		if p+l > end {
			return nil, false
		}
		if typ == extConnectionID {
			if l < 1 || int(m[p]) != l-1 || l == 1 {
				return nil, false // malformed, or an empty CID: none to route by
			}
			return m[p+1 : p+l : p+l], true
		}
		p += l
	}
	return nil, false
}

// sealed reports whether the server's datagram b holds a record of epoch 1
// or later: the server sent its Finished, the first record of epoch 1, so
// its side of the handshake is done. A tls12_cid record (its CID length is
// the client's, unknown here) is always of a later epoch.
func sealed(b []byte) bool {
	const header = 13 // type(1) version(2) epoch(2) sequence(6) length(2)
	for len(b) >= header {
		if b[0] == byte(dtls.TLS12CID) || b[3] != 0 || b[4] != 0 {
			return true
		}
		n := header + (int(b[11])<<8 | int(b[12]))
		if n > len(b) {
			return false
		}
		b = b[n:]
	}
	return false
}
