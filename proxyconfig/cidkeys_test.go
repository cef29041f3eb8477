package proxyconfig

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseCIDCodec(t *testing.T) {
	quicSvc := `"name": "q", "protocol": "quic", "listen": "127.0.0.1:4433", "backends": [{"ordinal": 0, "address": "127.0.0.1:6000"}]`
	for _, tt := range []struct {
		name        string
		svc, keys   string
		cidLen, non int
	}{
		{"dtls default length", svc, `"cid_codec": "quic-lb-encrypted", "cid_keys_file": "k.json"`, 8, 6},
		{"quic default length", quicSvc, `"cid_codec": "quic-lb-encrypted", "cid_keys_file": "k.json"`, 12, 10},
		{"single pass", quicSvc, `"cid_codec": "quic-lb-encrypted", "cid_nonce_length": 15, "cid_keys_file": "k.json"`, 17, 15},
		{"from cid_length", quicSvc, `"cid_codec": "quic-lb-encrypted", "cid_length": 20, "cid_keys_file": "k.json"`, 20, 18},
		{"both agree", svc, `"cid_codec": "quic-lb-encrypted", "cid_length": 6, "cid_nonce_length": 4, "cid_keys_file": "k.json"`, 6, 4},
	} {
		cfg, err := Parse(strings.NewReader(withServices(`{` + tt.svc + `, ` + tt.keys + `}`)))
		require.NoError(t, err, tt.name)
		s := cfg.Services[0]
		require.Equal(t, tt.cidLen, s.CIDLen, tt.name)
		require.Equal(t, &CIDEncryption{NonceLen: tt.non, KeysFile: "k.json"}, s.CIDEncryption, tt.name)
		require.Contains(t, cfg.Summary(), "quic-lb-encrypted with", tt.name)
	}
	cfg, err := Parse(strings.NewReader(withServices(`{` + svc + `}`)))
	require.NoError(t, err)
	require.Nil(t, cfg.Services[0].CIDEncryption)

	for _, tt := range []struct{ keys, want string }{
		{`"cid_codec": "aes"`, `services[0].cid_codec: "aes" is not a codec; write "quic-lb-encrypted", or leave the key out for the protocol's plaintext codec`},
		{`"cid_codec": "quic-lb-encrypted"`, `services[0].cid_keys_file: missing; add it: the path of the CID key file, such as "cid-keys.json"`},
		{`"cid_codec": "quic-lb-encrypted", "cid_nonce_length": 3, "cid_keys_file": "k"`, "services[0].cid_nonce_length: 3 is out of range; write 4-18 (15: single-pass AES, 17-octet CIDs)"},
		{`"cid_codec": "quic-lb-encrypted", "cid_nonce_length": 19, "cid_keys_file": "k"`, "services[0].cid_nonce_length: 19 is out of range"},
		{`"cid_codec": "quic-lb-encrypted", "cid_length": 5, "cid_keys_file": "k"`, "services[0].cid_length: 5 is not an encrypted CID length (2 + a nonce of 4-18 octets); write 6-20"},
		{`"cid_codec": "quic-lb-encrypted", "cid_length": 12, "cid_nonce_length": 4, "cid_keys_file": "k"`, "services[0].cid_nonce_length: 4 makes 6-octet CIDs, and cid_length says 12 (an encrypted CID is 2 + nonce octets); write 10, or leave one of the two keys out"},
		{`"cid_nonce_length": 10`, `services[0].cid_nonce_length: applies only with "cid_codec": "quic-lb-encrypted"; add "cid_codec": "quic-lb-encrypted", or remove it`},
		{`"cid_keys_file": "k"`, `services[0].cid_keys_file: applies only with "cid_codec": "quic-lb-encrypted"`},
	} {
		_, err := Parse(strings.NewReader(withServices(`{` + svc + `, ` + tt.keys + `}`)))
		require.ErrorContains(t, err, tt.want, tt.keys)
	}
}
