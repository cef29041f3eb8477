//go:build linux

package udpio_test

import (
	"errors"
	"testing"

	"github.com/cidroute/cidroute/quic"
	"github.com/cidroute/cidroute/udpio"
)

// A caller filling Steering from its codec, as the docs say, gets a clear
// refusal for an encrypted codec instead of a program that would steer by
// a ciphertext octet; the plaintext codecs attach.
func TestAttachSteeringCodecs(t *testing.T) {
	group, err := udpio.ListenGroup("udp4", "127.0.0.1:0", 2, udpio.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range group {
			c.Close()
		}
	}()
	enc, err := quic.NewLBEncrypted(quic.LBEncryptedConfig{Keys: []quic.LBKey{{ConfigID: 0}}})
	if err != nil {
		t.Fatal(err)
	}
	err = udpio.AttachSteering(group, udpio.Steering{QUIC: true, CIDLen: quic.LB{}.Len(), OrdinalOffset: quic.LB{}.OrdinalOffset()})
	if err != nil {
		t.Fatalf("plaintext QUIC-LB: %v", err)
	}
	err = udpio.AttachSteering(group, udpio.Steering{QUIC: true, CIDLen: enc.Len(), OrdinalOffset: enc.OrdinalOffset()})
	if !errors.Is(err, udpio.ErrNoOrdinalByte) {
		t.Fatalf("encrypted QUIC-LB: %v", err)
	}
	t.Logf("refused: %v", err)
}
