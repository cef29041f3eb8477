//go:build !unix

package cidkeys

import "io/fs"

// fileOwner returns -1: file owners are not known here, so only the strict
// rule (no group or other access) applies.
func fileOwner(fs.FileInfo) int { return -1 }
