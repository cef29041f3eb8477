package hrw

import (
	"os"
	"testing"
)

func TestBuildOnce(t *testing.T) {
	if os.Getenv("HRWBUILD") == "" {
		t.Skip()
	}
	cs := mixedCands(254)
	for range 5 {
		New(42, cs)
	}
}
