//go:build unix

package cidkeys

import (
	"io/fs"
	"syscall"
)

// fileOwner returns the uid owning a file, or -1.
func fileOwner(fi fs.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid)
	}
	return -1
}
