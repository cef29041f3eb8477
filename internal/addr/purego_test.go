//go:build purego

package addr

const purego = true
