package proxyconfig

import (
	"io"

	"github.com/cidroute/cidroute/internal/strictjson"
)

// decodeStrict decodes exactly one JSON value from r into v, the one way
// every object of the configuration file is read (internal/strictjson,
// shared with the CID key file): every key must be a field's JSON name
// exactly, appear once per object, and nothing may follow the value. A
// json.RawMessage is left to the decoder it is handed to, which names it
// in its errors: a service's to decodeStrict again, a backend list's to
// registry.DecodeBackends, which has the same rules.
func decodeStrict(r io.Reader, v any) error {
	if err := strictjson.Decode(r, v); err != nil {
		return jsonError(err)
	}
	return nil
}
