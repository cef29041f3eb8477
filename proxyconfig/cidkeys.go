package proxyconfig

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/cidroute/cidroute/internal/boundedread"

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

// parseCIDCodec applies cid_codec, cid_nonce_length and cid_keys_file of
// the service at path to s, whose CIDLen holds cid_length or the
// protocol's default. The CID is 2 + nonce octets, so cid_length and
// cid_nonce_length may each be given alone; both must agree.
func parseCIDCodec(src *source, path string, fs *fileService, s *Service) error {
	at := func(key string) string { return path + "." + key }
	switch fs.CIDCodec {
	case "":
		for _, key := range []string{"cid_nonce_length", "cid_keys_file"} {
			if src.has(at(key)) {
				return src.keyErr(at(key), fmt.Sprintf("applies only with \"cid_codec\": %q", codecEncrypted), fmt.Sprintf("add \"cid_codec\": %q, or remove it", codecEncrypted))
			}
		}
		return nil
	case codecEncrypted:
	default:
		return src.err(at("cid_codec"), fmt.Sprintf("%q is not a codec", fs.CIDCodec), "write "+want(at("cid_codec")))
	}
	nonce := fs.CIDNonceLength
	hasNonce, hasLen := src.has(at("cid_nonce_length")), src.has(at("cid_length"))
	switch {
	case !hasNonce:
		nonce = s.CIDLen - 2 // cid_length, or the default 8 (DTLS) or 12 (QUIC)
	case hasLen && fs.CIDLength != nonce+2:
		return src.err(at("cid_nonce_length"), fmt.Sprintf("%d makes %d-octet CIDs, and cid_length says %d (an encrypted CID is 2 + nonce octets)", nonce, nonce+2, fs.CIDLength),
			fmt.Sprintf("write %d, or leave one of the two keys out", fs.CIDLength-2))
	}
	if nonce < quic.LBMinNonceLen || nonce > quic.LBMaxNonceLen {
		if !hasNonce {
			return src.err(at("cid_length"), fmt.Sprintf("%d is not an encrypted CID length (2 + a nonce of %d-%d octets)", s.CIDLen, quic.LBMinNonceLen, quic.LBMaxNonceLen),
				fmt.Sprintf("write %d-%d", quic.LBMinNonceLen+2, quic.LBMaxNonceLen+2))
		}
		return src.err(at("cid_nonce_length"), fmt.Sprintf("%d is out of range", nonce),
			fmt.Sprintf("write %d-%d (%d: single-pass AES, 17-octet CIDs)", quic.LBMinNonceLen, quic.LBMaxNonceLen, quic.LBSinglePassNonceLen))
	}
	if !src.has(at("cid_keys_file")) {
		return src.err(at("cid_keys_file"), "missing", "add it: "+want(at("cid_keys_file")))
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
		if _, err := c.openKeys(ctx, s); err != nil {
			return err
		}
	}
	return nil
}

// openKeys opens the key file of s, a service of c (which may be nil), if
// it has one; the errors, but for ctx's, are *Error at its cid_keys_file.
func (c *Config) openKeys(ctx context.Context, s Service) (*cidkeys.File, error) {
	e := s.CIDEncryption
	if e == nil {
		return nil, nil
	}
	f, err := cidkeys.Open(ctx, e.KeysFile, e.NonceLen)
	switch {
	case err == nil:
		return f, nil
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return nil, err
	case errors.Is(err, cidkeys.ErrMode):
		mode := ""
		if fi, serr := os.Stat(e.KeysFile); serr == nil {
			mode = fmt.Sprintf(" (mode %04o)", fi.Mode().Perm())
		}
		return nil, c.serviceErr(s, "cid_keys_file", fmt.Sprintf("%s is readable or writable by group or others%s", e.KeysFile, mode), "chmod 600 "+e.KeysFile, err)
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, fs.ErrPermission), errors.Is(err, boundedread.ErrNotRegular),
		errors.Is(err, boundedread.ErrTooLarge), errors.Is(err, boundedread.ErrTimeout), errors.Is(err, boundedread.ErrBlocked):
		problem, fix := readError(e.KeysFile, err)
		return nil, c.serviceErr(s, "cid_keys_file", e.KeysFile+" "+problem, fix, err)
	}
	msg := strings.ReplaceAll(err.Error(), "cidkeys: ", "")
	if !strings.HasPrefix(msg, e.KeysFile) {
		msg = e.KeysFile + ": " + msg
	}
	return nil, c.serviceErr(s, "cid_keys_file", msg, "see the key file's format in docs/configuration.md", err)
}
