// Package k8s holds the Kubernetes DRA driver qpu.qrtd.io
// (cmd/qrt-dra-driver, internal/driver) and its deploy manifests
// (deploy/); see README.md.
package k8s

import "time"

func timeNow() time.Time { return time.Now() }
