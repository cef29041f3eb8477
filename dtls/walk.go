//go:build !cidroute_plain_dtls

package dtls

// walk is Classify's record loop: the same checks as parseRecord, without
// building a Record; on any failure parseRecord runs again to pick the
// error, so that both always agree (FuzzClassify checks it).
//
// It is a second copy of parseRecord's checks kept for speed (issue 18
// measures it end to end); the cidroute_plain_dtls build tag selects the
// plain loop over parseRecord in walk_plain.go instead.
func walk(b []byte, cidLen int) (Class, error) {
	var c Class
	for len(b) > 0 {
		if len(b) < HeaderLen || (uint16(b[1])<<8|uint16(b[2]))|2 != VersionDTLS10 { // fe fd or fe ff
			return classifyError(b, cidLen, c.Records)
		}
		h := HeaderLen
		switch t := ContentType(b[0]); {
		case t == TLS12CID:
			h += cidLen
			if len(b) < h {
				return classifyError(b, cidLen, c.Records)
			}
			if c.CID == nil {
				c.CID = b[11 : h-2 : h-2]
			}
		case t < ChangeCipherSpec || t > ApplicationData:
			return classifyError(b, cidLen, c.Records)
		}
		lb := b[h-2 : h]
		l := int(lb[0])<<8 | int(lb[1])
		if l == 0 || l > len(b)-h {
			return classifyError(b, cidLen, c.Records)
		}
		c.ClientHello = c.ClientHello || isClientHello(b, h)
		c.Records++
		b = b[h+l:]
	}
	c.Kind = KindNew
	if c.CID != nil {
		c.Kind = KindEstablished
	}
	return c, nil
}
