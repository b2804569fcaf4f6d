package k8s

import (
	"os/exec"
	"strings"
	"testing"
)

// The production tree (api/, cmd/, internal/) links no test code: the
// API-server stand-in and the control plane runner live under test/, and
// the driver's binary depends on neither, nor on package testing.
func TestTheDriverBinaryLinksNoTestPackage(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "./cmd/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 100 {
		t.Fatalf("go list -deps ./cmd/... gave %d packages: %s", len(deps), out)
	}
	for _, p := range deps {
		if p == "testing" || strings.HasPrefix(p, "qrtd.io/tools/integrations/k8s/test/") {
			t.Errorf("the driver's binary links %s", p)
		}
	}
}
