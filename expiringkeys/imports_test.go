package expiringkeys_test

import (
	"os/exec"
	"strings"
	"testing"
)

const pkg = "github.com/watermill-dedup/dedup/expiringkeys"

// The package's imports go one way: it imports the stores and Watermill
// (and the root package's errors), never the module's internals, and no
// other package of the module imports it.
func TestImportsOneWay(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "github.com/watermill-dedup/dedup/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		importer, imports := fields[0], fields[1:]
		for _, imp := range imports {
			switch {
			case importer == pkg && strings.Contains(imp, "/internal/"):
				t.Errorf("%s imports %s: it may import the stores and Watermill, not the module's internals", pkg, imp)
			case importer != pkg && imp == pkg:
				t.Errorf("%s imports %s: nothing in the module may", importer, pkg)
			}
		}
	}
}
