//go:build cidroute_plain_dtls

package dtls

// walk is Classify's record loop over parseRecord: the plain version of
// walk.go's, selected by the cidroute_plain_dtls build tag.
func walk(b []byte, cidLen int) (Class, error) {
	var c Class
	for len(b) > 0 {
		r, n, err := parseRecord(b, cidLen)
		if err != nil {
			if err == ErrTooShort && c.Records > 0 {
				err = ErrTruncated // trailing bytes after a whole record
			}
			return Class{Records: c.Records}, err
		}
		if r.Type == TLS12CID && c.CID == nil {
			c.CID = r.CID
		}
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
