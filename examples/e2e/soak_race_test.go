//go:build race

package e2e

import "time"

// The race detector slows everything several times over: echoes take
// longer, and the floods are thinner so that they still leave the
// legitimate traffic some CPU.
func init() {
	soakRace = true
	soakWait = time.Second
	soakDrainWait = 3 * time.Second
}
