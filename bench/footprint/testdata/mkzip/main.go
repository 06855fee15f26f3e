// Command mkzip writes the module zip a module proxy serves for the
// module in a directory, with the go command's own rules (golang.org/x/mod/zip):
// nested modules, vendor directories and files it refuses are left out.
//
//	mkzip <module path> <version> <dir> <out.zip>
package main

import (
	"fmt"
	"os"

	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

func main() {
	if len(os.Args) != 5 {
		fmt.Fprintln(os.Stderr, "usage: mkzip <module path> <version> <dir> <out.zip>")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2], os.Args[3], os.Args[4]); err != nil {
		fmt.Fprintln(os.Stderr, "mkzip:", err)
		os.Exit(1)
	}
}

func run(path, version, dir, out string) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	if err := zip.CreateFromDir(f, module.Version{Path: path, Version: version}, dir); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
