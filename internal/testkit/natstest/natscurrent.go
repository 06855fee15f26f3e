package natstest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/watermill-dedup/dedup/internal/testkit"
)

// The nats-server executables tests start servers of: Debian's on $PATH
// (SystemNATS), the one the shared server on 127.0.0.1:4222 runs, and the
// current release (CurrentNATS), which the tests build once per machine
// with go install, outside the module (its go.mod does not list the
// server), into the user's cache directory.

// CurrentNATSVersion is the nats-server release CurrentNATS builds: one
// with per-message TTLs (2.11 or later), which natsstore then uses.
const CurrentNATSVersion = "v2.15.3"

// currentNATSPackage is what go install builds, at CurrentNATSVersion.
const currentNATSPackage = "github.com/nats-io/nats-server/v2"

// EnvCurrentNATS names a nats-server executable (2.11 or later) that
// CurrentNATS returns instead of building one: for a machine without the
// Go module proxy.
const EnvCurrentNATS = "NATS_SERVER_CURRENT"

// NATSBin is a nats-server executable.
type NATSBin struct {
	// Path is the executable.
	Path string
	// Version is its release ("v2.15.3"), "" when it was not asked
	// (the one on $PATH).
	Version string
}

// SystemNATS returns the nats-server on $PATH, or fails the test naming
// it (see Unavailable).
func SystemNATS(t testing.TB) NATSBin {
	t.Helper()
	p, err := exec.LookPath("nats-server")
	if err != nil {
		testkit.Unavailable(t, "nats-server (to start NATS servers of the test's own)", "$PATH", err)
	}
	return NATSBin{Path: p}
}

// CurrentNATS returns nats-server CurrentNATSVersion: $NATS_SERVER_CURRENT
// when set, else the executable built into the user's cache directory
// (os.UserCacheDir()/watermill-dedup/nats-server-<version>), which it
// builds first when it is not there (go install through the Go module
// proxy, about 30 seconds; several test processes at once build it once).
// When it cannot be built the test fails naming what is missing (see
// Unavailable).
func CurrentNATS(t testing.TB) NATSBin {
	t.Helper()
	if p := os.Getenv(EnvCurrentNATS); p != "" {
		if err := checkExecutable(p); err != nil {
			testkit.Unavailable(t, "nats-server "+CurrentNATSVersion+" (named by "+EnvCurrentNATS+")", p, err)
		}
		return NATSBin{Path: p, Version: CurrentNATSVersion}
	}
	dir, err := natsCacheDir()
	if err == nil {
		var p string
		if p, err = buildNATS(dir, CurrentNATSVersion); err == nil {
			return NATSBin{Path: p, Version: CurrentNATSVersion}
		}
	}
	testkit.Unavailable(t, "nats-server "+CurrentNATSVersion+" (built once with go install through the Go module proxy)", "the user's cache directory", err)
	return NATSBin{}
}

// natsCacheDir is where CurrentNATS keeps the executables it built.
func natsCacheDir() (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cache, "watermill-dedup")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	return dir, nil
}

// buildNATS returns the nats-server of version in dir, building it there
// when it is missing: go install into a temporary directory of dir, then
// a rename, so that no process ever runs a half-written executable. A
// lock file (on Linux) makes concurrent callers, in this process or
// others, build it once; without the lock each builds and the last
// rename wins, with the same result.
func buildNATS(dir, version string) (string, error) {
	exe := "nats-server"
	if runtime.GOOS == "windows" {
		exe += ".exe"
	}
	bin := filepath.Join(dir, "nats-server-"+version)
	if checkExecutable(bin) == nil {
		return bin, nil
	}
	unlock, err := testkit.LockFile(bin + ".lock")
	if err != nil {
		return "", err
	}
	defer unlock()
	if checkExecutable(bin) == nil {
		return bin, nil // built by another process meanwhile
	}
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	cmd := exec.Command(goTool(), "install", currentNATSPackage+"@"+version)
	cmd.Dir = tmp // outside any module: go.mod does not list the server
	cmd.Env = append(os.Environ(), "GOBIN="+tmp, "GOFLAGS=", "GOWORK=off", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		return "", fmt.Errorf("go install %s@%s: %w: %s", currentNATSPackage, version, err, strings.Join(testkit.LastLines(lines, 3), "; "))
	}
	if err := os.Rename(filepath.Join(tmp, exe), bin); err != nil {
		return "", err
	}
	return bin, nil
}

// goTool is the go command: the one of the toolchain running the tests
// (go test puts its GOROOT/bin first on $PATH), else $GOROOT's.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// checkExecutable reports why path is not an executable file.
func checkExecutable(path string) error {
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		return err
	case fi.IsDir():
		return errors.New("is a directory")
	case runtime.GOOS != "windows" && fi.Mode().Perm()&0o111 == 0:
		return errors.New("is not executable")
	}
	return nil
}
