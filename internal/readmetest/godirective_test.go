package readmetest

import (
	"encoding/json"
	"go/version"
	"os/exec"
	"strings"
	"testing"
)

// go.mod's go directive is the lowest Go the module's packages and their
// dependencies (tests included) need: the highest go directive among the
// dependencies, so that no user's module is forced to a later release
// than they need.
func TestGoDirectiveIsTheDependenciesFloor(t *testing.T) {
	if testing.Short() {
		t.Skip("lists every dependency")
	}
	out, err := exec.Command("go", "mod", "edit", "-json", "../../go.mod").Output()
	if err != nil {
		t.Fatalf("go mod edit -json: %v", err)
	}
	var mod struct {
		Go        string
		Toolchain string
		Module    struct{ Path string }
	}
	if err := json.Unmarshal(out, &mod); err != nil {
		t.Fatal(err)
	}
	if mod.Toolchain != "" {
		t.Errorf("go.mod has a toolchain line (%s): it forces a download on users with an older Go", mod.Toolchain)
	}
	cmd := exec.Command("go", "list", "-deps", "-test", "-f", "{{with .Module}}{{if ne .Path \""+mod.Module.Path+"\"}}{{.Path}} {{.GoVersion}}{{end}}{{end}}", "./...")
	cmd.Dir = "../.."
	out, err = cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	floor, by := "1.0", ""
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, v, ok := strings.Cut(line, " ")
		if ok && v != "" && version.Compare("go"+v, "go"+floor) > 0 {
			floor, by = v, path
		}
	}
	if mod.Go != floor {
		t.Fatalf("go.mod says go %s; the dependencies need go %s (%s): the directive is the lowest that builds", mod.Go, floor, by)
	}
}
