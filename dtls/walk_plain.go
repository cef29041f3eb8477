//go:build cidroute_plain_dtls

package dtls

// Classify walks every record of the datagram b and reports its routing
// class: the plain loop over parseRecord that the cidroute_plain_dtls build
// tag selects (see walk.go).
func Classify(b []byte, cidLen int) (Class, error) {
	if cidLen < MinCIDLen || cidLen > MaxCIDLen {
		return Class{}, ErrCIDLength
	}
	if len(b) == 0 {
		return Class{}, ErrTooShort
	}
	var c Class
	for len(b) > 0 {
		r, n, err := parseRecord(b, cidLen)
		if err != nil {
			if err == ErrTooShort && c.Records > 0 {
				err = ErrTruncated // trailing bytes after a whole record
			}
			return Class{Records: c.Records}, err
		}
		if r.CID != nil && c.CID == nil {
			c.CID = r.CID // tls12_cid, or a unified header with the C bit
		}
		c.Unified = c.Unified || r.Unified != 0
		c.ClientHello = c.ClientHello || r.Type == Handshake && r.Epoch == 0 && r.Fragment[0] == byte(HandshakeClientHello)
		c.Records++
		b = b[n:]
	}
	c.Kind = KindNew
	if c.CID != nil {
		c.Kind = KindEstablished
	}
	return c, nil
}
