//go:build !unix

package boundedread

import "os"

func open(path string) (*os.File, error) { return os.Open(path) }
