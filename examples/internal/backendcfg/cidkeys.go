package backendcfg

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/cidroute/cidroute/cidkeys"
)

// CIDKeyFlags are the flags of encrypted QUIC-LB connection IDs that both
// backends take: the key file the proxies use too (cidproxy's
// cid_keys_file), whose "active" configuration the backend encrypts new
// CIDs with, and the nonce length.
type CIDKeyFlags struct {
	Keys     string
	NonceLen int
}

// Register defines -cid-keys and -cid-nonce-len on fs.
func (f *CIDKeyFlags) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.Keys, "cid-keys", "", "QUIC-LB key `file` (JSON, mode 0600): issue encrypted CIDs (the proxies' cid_codec quic-lb-encrypted); re-read when it changes and on SIGHUP")
	fs.IntVar(&f.NonceLen, "cid-nonce-len", 0, "with -cid-keys: nonce octets, 4-18, the CID being 2 + nonce octets (15: single-pass AES); 0 = -cid-len less 2")
}

// Open returns nil without -cid-keys; else the key file with its codec,
// whose length is cidLen (the -cid-len flag, explicit when lenSet) or 2 +
// -cid-nonce-len. Keep the codec in step with the file by Watch. ctx
// cancels the read.
func (f *CIDKeyFlags) Open(ctx context.Context, cidLen int, lenSet bool) (*cidkeys.File, error) {
	if f.Keys == "" {
		if f.NonceLen != 0 {
			return nil, fmt.Errorf("-cid-nonce-len needs -cid-keys")
		}
		return nil, nil
	}
	nonce := f.NonceLen
	switch {
	case nonce == 0:
		nonce = cidLen - 2
	case lenSet && cidLen != nonce+2:
		return nil, fmt.Errorf("-cid-len %d and -cid-nonce-len %d disagree: an encrypted CID is 2 + nonce octets", cidLen, nonce)
	}
	kf, err := cidkeys.Open(ctx, f.Keys, nonce)
	if err != nil {
		return nil, fmt.Errorf("-cid-keys: %w", err)
	}
	return kf, nil
}

// IsSet reports whether the flag name was given on the command line.
func IsSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// Watch re-reads kf when it changes and on SIGHUP until ctx is done.
func Watch(ctx context.Context, kf *cidkeys.File) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				kf.Reload()
			}
		}
	}()
	go kf.Run(ctx)
}
