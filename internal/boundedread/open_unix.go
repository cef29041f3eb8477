//go:build unix

package boundedread

import (
	"os"
	"syscall"
)

// open does not wait for a FIFO's writer, nor make a terminal ours.
func open(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
}
