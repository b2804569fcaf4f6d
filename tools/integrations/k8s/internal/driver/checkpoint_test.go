package driver

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

// A checkpoint of a driver before checkpoints had a version is read (the
// same layout), and written again with this driver's version; one of a
// later format, left by a newer driver before a downgrade, stops the
// driver at start with the file and both versions named, rather than be
// read as something it is not.
func TestACheckpointWithoutAVersionIsReadAndOneOfANewerFormatRefused(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{NodeName: nodeName, StateDir: filepath.Join(dir, "state"), CDIDir: filepath.Join(dir, "cdi")}
	claims := filepath.Join(cfg.StateDir, "claims")
	if err := os.MkdirAll(claims, 0o750); err != nil {
		t.Fatal(err)
	}
	// What the driver wrote before: no "version".
	legacy := `{"uid":"uid-old","namespace":"team-a","name":"c","idempotency_key":"k8s-claim-uid-old-00",` +
		`"request":{"duration_ns":2000000,"qpus":["qpu0"]},"slots":[{"reservation_id":7,"qpu":"qpu0",` +
		`"start_ns":1,"end_ns":2000001,"fencing_token":70,"calibration_id":3,"tenant":"root/team-a",` +
		`"state":"held","lease_expires_ns":5}],"devices":[]}`
	if err := os.WriteFile(filepath.Join(claims, "uid-old.json"), []byte(legacy), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := New(cfg, nil)
	if err != nil {
		t.Fatalf("a checkpoint without a version: %v", err)
	}
	cp := d.Prepared(types.UID("uid-old"))
	if cp == nil || cp.Version != CheckpointVersion || cp.Slots[0].ReservationID != 7 || cp.Slots[0].FencingToken != 70 ||
		cp.IdempotencyKey() != "k8s-claim-uid-old-00" {
		t.Fatalf("read as %+v", cp)
	}
	if err := d.saveCheckpoint(cp); err != nil {
		t.Fatal(err)
	}
	var written struct {
		Version int `json:"version"`
	}
	data, _ := os.ReadFile(filepath.Join(claims, "uid-old.json"))
	if err := json.Unmarshal(data, &written); err != nil || written.Version != CheckpointVersion {
		t.Errorf("written again as %s", data)
	}

	newer := filepath.Join(claims, "uid-new.json")
	if err := os.WriteFile(newer, []byte(`{"version":2,"uid":"uid-new","state":"something new"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = New(cfg, nil)
	if err == nil || !strings.Contains(err.Error(), newer) || !strings.Contains(err.Error(), "format 2") ||
		!strings.Contains(err.Error(), "formats up to 1") {
		t.Errorf("a checkpoint of format 2: %v", err)
	}
	t.Logf("refused as: %v", err)
}
