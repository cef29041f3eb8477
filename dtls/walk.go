//go:build !cidroute_plain_dtls

package dtls

// Classify walks every record of the datagram b and reports its routing
// class. cidLen is the service's configured CID length (MinCIDLen to
// MaxCIDLen), that of tls12_cid records and of DTLS 1.3 unified headers
// with the C bit alike. It fails when any record is malformed or when
// bytes follow the last whole record; a datagram with a broken record is
// never reported as new, even if an earlier record was a valid
// ClientHello. It does not allocate.
//
// DTLS 1.3 (RFC 9147): its plaintext records (ClientHello, HelloRetryRequest,
// ACK) have the DTLS 1.2 header; its ciphertext records the unified
// header, a CID in which routes the datagram as a tls12_cid record's does.
// A unified header without length runs to the end of the datagram.
//
// Mixed datagrams: RFC 6347 §4.1 lets a datagram hold several records and
// neither it nor RFC 9146 forbids a ClientHello (a new association) beside
// tls12_cid records of an established one, so such a datagram is valid: it
// is KindEstablished (routed by its CID) and also ClientHello (counted as a
// new handshake).
//
// The loop repeats parseRecord's checks without building a Record; on any
// failure parseRecord runs again to pick the error, so that both always
// agree (FuzzClassify checks it). This second copy of the checks is kept
// for speed, one of the tricks issue 18 measures end to end; the
// cidroute_plain_dtls build tag selects the plain loop over parseRecord in
// walk_plain.go instead. measured end to end (bash bench/tricks.sh e2e 4, 2026-12-01, load 3-4: cidproxy's CPU per datagram under ../shared/bench against the build without it; noise about ±1.7 %): it saves
// 1.0 % at 100k/s, 0.4 % at 50k/s, -1.7 % at 25k/s: kept, at the 1 % line.
func Classify(b []byte, cidLen int) (Class, error) {
	if cidLen < MinCIDLen || cidLen > MaxCIDLen {
		return Class{}, ErrCIDLength
	}
	if len(b) == 0 {
		return Class{}, ErrTooShort
	}
	var cid []byte
	records := 0
	hello, unified := false, false
	for len(b) > 0 {
		if IsUnified(b[0]) {
			f := b[0]
			h := unifiedHeaderLen(f)
			if f&UnifiedCID != 0 {
				h += cidLen
			}
			if len(b) < h {
				return classifyError(b, cidLen, records)
			}
			if f&UnifiedCID != 0 && cid == nil {
				cid = b[1 : 1+cidLen : 1+cidLen]
			}
			l := len(b) - h
			if f&UnifiedLength != 0 {
				l = int(b[h-2])<<8 | int(b[h-1])
			}
			if l == 0 || l > len(b)-h {
				return classifyError(b, cidLen, records)
			}
			unified = true
			records++
			b = b[h+l:]
			continue
		}
		if len(b) < HeaderLen || (uint16(b[1])<<8|uint16(b[2]))|2 != VersionDTLS10 { // fe fd or fe ff
			return classifyError(b, cidLen, records)
		}
		h := HeaderLen
		switch t := ContentType(b[0]); {
		case t == TLS12CID:
			h += cidLen
			if len(b) < h {
				return classifyError(b, cidLen, records)
			}
			if cid == nil {
				cid = b[11 : h-2 : h-2]
			}
		case t == ACK:
		case t < ChangeCipherSpec || t > ApplicationData:
			return classifyError(b, cidLen, records)
		}
		lb := b[h-2 : h]
		l := int(lb[0])<<8 | int(lb[1])
		if l == 0 || l > len(b)-h {
			return classifyError(b, cidLen, records)
		}
		hello = hello || isClientHello(b, h)
		records++
		b = b[h+l:]
	}
	if cid == nil {
		return Class{Kind: KindNew, ClientHello: hello, Records: records, Unified: unified}, nil
	}
	return Class{Kind: KindEstablished, CID: cid, ClientHello: hello, Records: records, Unified: unified}, nil
}
