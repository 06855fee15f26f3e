// Package readmetest checks that the Go snippets of README.md compile.
package readmetest

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
)

var goBlock = regexp.MustCompile("(?s)```go\n(.*?)```")

// TestReadmeSnippetsCompile builds every ```go block of README.md that is a
// whole program (package main), as if it were a package of this module,
// without writing into the module tree (go build -overlay).
func TestReadmeSnippetsCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a program")
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := goBlock.FindAllSubmatch(readme, -1)
	built := 0
	for i, b := range blocks {
		if !regexp.MustCompile(`(?m)^package main$`).Match(b[1]) {
			continue
		}
		tmp := t.TempDir()
		src := filepath.Join(tmp, "main.go")
		if err := os.WriteFile(src, b[1], 0o600); err != nil {
			t.Fatal(err)
		}
		abs, err := filepath.Abs(filepath.Join("snippet", "main.go"))
		if err != nil {
			t.Fatal(err)
		}
		overlay, _ := json.Marshal(map[string]map[string]string{"Replace": {abs: src}})
		ov := filepath.Join(tmp, "overlay.json")
		if err := os.WriteFile(ov, overlay, 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("go", "build", "-overlay", ov, "-o", os.DevNull, "./snippet")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("README.md go block %d does not compile: %v\n%s\n--- block ---\n%s", i+1, err, out, b[1])
		}
		built++
	}
	if built == 0 {
		t.Fatal("README.md has no package main snippet to check")
	}
}
