package proxyconfig

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/cidroute/cidroute/cidkeys"
	"github.com/cidroute/cidroute/quic"
)

// codecEncrypted is the cid_codec value of encrypted QUIC-LB CIDs
// (quic.LBEncrypted); without cid_codec a service uses its protocol's
// plaintext codec (ordinal-first for DTLS, QUIC-LB plaintext for QUIC).
const codecEncrypted = "quic-lb-encrypted"

// CIDEncryption is a service's encrypted CID configuration ("cid_codec":
// "quic-lb-encrypted"). The keys stay in their file (package cidkeys): they
// are read by Build and CheckFiles, and again by Registries.Run when the
// file changes or on Registries.Reload.
type CIDEncryption struct {
	NonceLen int    // cid_nonce_length; the CID is 2 + NonceLen octets
	KeysFile string // cid_keys_file
}

// parseCIDCodec applies cid_codec, cid_nonce_length and cid_keys_file to
// s, whose CIDLen holds cid_length or the protocol's default. The CID is 2
// + nonce octets, so cid_length and cid_nonce_length may each be given
// alone; both must agree.
func parseCIDCodec(fs *fileService, s *Service) error {
	switch fs.CIDCodec {
	case "":
		if fs.CIDNonceLength != 0 || fs.CIDKeysFile != "" {
			return fmt.Errorf("cid_nonce_length and cid_keys_file need \"cid_codec\": %q", codecEncrypted)
		}
		return nil
	case codecEncrypted:
	default:
		return fmt.Errorf("cid_codec %q: want %q, or leave it out for the protocol's plaintext codec", fs.CIDCodec, codecEncrypted)
	}
	nonce := fs.CIDNonceLength
	switch {
	case nonce == 0:
		nonce = s.CIDLen - 2 // cid_length, or the default 8 (DTLS) or 12 (QUIC)
	case fs.CIDLength != 0 && fs.CIDLength != nonce+2:
		return fmt.Errorf("cid_length %d and cid_nonce_length %d disagree: an encrypted CID is 2 + nonce octets", fs.CIDLength, nonce)
	}
	if nonce < quic.LBMinNonceLen || nonce > quic.LBMaxNonceLen {
		return fmt.Errorf("cid_nonce_length %d: want %d to %d (%d: single-pass AES, 17-octet CIDs)",
			nonce, quic.LBMinNonceLen, quic.LBMaxNonceLen, quic.LBSinglePassNonceLen)
	}
	if fs.CIDKeysFile == "" {
		return fmt.Errorf("cid_keys_file is required with cid_codec %q", codecEncrypted)
	}
	s.CIDLen = nonce + 2
	s.CIDEncryption = &CIDEncryption{NonceLen: nonce, KeysFile: fs.CIDKeysFile}
	return nil
}

// resolve makes a relative key file path relative to dir (the config
// file's directory), as backends_file is.
func (e *CIDEncryption) resolve(dir string) {
	if e != nil && !filepath.IsAbs(e.KeysFile) {
		e.KeysFile = filepath.Join(dir, e.KeysFile)
	}
}

// summary is the codec's part of the config summary (no key material).
func (e *CIDEncryption) summary() string {
	if e == nil {
		return ""
	}
	return fmt.Sprintf(", %s with %d-octet nonces, keys from %s", codecEncrypted, e.NonceLen, e.KeysFile)
}

// checkCIDKeyFiles reads every service's key file once, for -check.
func (c *Config) checkCIDKeyFiles(ctx context.Context) error {
	for _, s := range c.Services {
		if e := s.CIDEncryption; e != nil {
			if _, err := cidkeys.Open(ctx, e.KeysFile, e.NonceLen); err != nil {
				return fmt.Errorf("service %q: cid_keys_file: %w", s.Name, err)
			}
		}
	}
	return nil
}
