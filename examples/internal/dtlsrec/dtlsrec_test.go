package dtlsrec

import (
	"bytes"
	"testing"

	"github.com/cidroute/cidroute/dtls"
)

func TestRecordsClassify(t *testing.T) {
	cid := []byte{2, 1, 2, 3, 4, 5, 6, 7}
	c, err := dtls.Classify(AppendClientHello(nil, 0, []byte("hello")), len(cid))
	if err != nil || c.Kind != dtls.KindNew || !c.ClientHello {
		t.Fatalf("ClientHello: %+v, %v", c, err)
	}
	c, err = dtls.Classify(AppendCIDRecord(nil, 7, cid, []byte("data")), len(cid))
	if err != nil || c.Kind != dtls.KindEstablished || !bytes.Equal(c.CID, cid) {
		t.Fatalf("CID record: %+v, %v", c, err)
	}
}
