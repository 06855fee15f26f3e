package natstest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBuildNATSCached: an executable already in the cache directory is
// used as it is, without go install.
func TestBuildNATSCached(t *testing.T) {
	dir := t.TempDir()
	want := filepath.Join(dir, "nats-server-v9.9.9")
	if err := os.WriteFile(want, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := buildNATS(dir, "v9.9.9")
	if err != nil || got != want {
		t.Fatalf("buildNATS = %q, %v; want %q", got, err, want)
	}
}

// TestBuildNATSFails: a release the module proxy does not have fails
// naming go install, and leaves nothing in the cache directory but the
// lock file.
func TestBuildNATSFails(t *testing.T) {
	dir := t.TempDir()
	_, err := buildNATS(dir, "v0.0.0-none")
	if err == nil || !strings.Contains(err.Error(), "go install github.com/nats-io/nats-server/v2@v0.0.0-none") {
		t.Fatalf("buildNATS of a missing release: %v", err)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".lock") {
			t.Errorf("left in the cache directory: %s", e.Name())
		}
	}
}
