//go:build !race

package quicgo

const raceDetector = false
