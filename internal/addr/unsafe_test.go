//go:build !purego

package addr

const purego = false
