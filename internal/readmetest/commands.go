// Package readmetest keeps the docs true. Its tests check the Go programs
// of README.md: every one compiles, and the Quickstart and the Prometheus
// program do what the README says they do. Commands finds the command
// lines the docs show, for the tests of router_example and cmd/dedupctl.
package readmetest

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// Command is a `go run PROGRAM ...` line the docs show.
type Command struct {
	Where   string   // the file
	Line    string   // as written
	Program string   // such as "./router_example"
	Args    []string // the program's arguments
}

var shBlock = regexp.MustCompile("(?s)```sh\n(.*?)```")

// Commands finds every `go run PROGRAM ...` command (program as in
// "./router_example") that files show, once each: the lines of a
// Markdown file's sh blocks and of a Go file's doc comment (indented
// "//\t" lines). A line is split on blanks as a shell would, honouring
// single quotes, and a # comment at its end is dropped.
func Commands(t testing.TB, program string, files ...string) []Command {
	t.Helper()
	docComment := regexp.MustCompile(`(?m)^//\t(go run ` + regexp.QuoteMeta(program) + `.*)$`)
	var (
		out  []Command
		seen = map[string]bool{}
	)
	add := func(where, line string) {
		f := shellFields(line)
		if len(f) < 3 || f[0] != "go" || f[1] != "run" || f[2] != program {
			return
		}
		key := strings.Join(f[3:], " ")
		if seen[key] {
			return
		}
		seen[key] = true
		out = append(out, Command{where, line, program, f[3:]})
	}
	for _, path := range files {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(path, ".go") {
			for _, m := range docComment.FindAllStringSubmatch(string(data), -1) {
				add(path, m[1])
			}
			continue
		}
		for _, block := range shBlock.FindAllStringSubmatch(string(data), -1) {
			for _, line := range strings.Split(block[1], "\n") {
				add(path, line)
			}
		}
	}
	return out
}

// Blocks returns the `go run` commands of each sh block of the Markdown
// file path, in the order the block gives them, for the blocks that
// show one of every program given (such as "./router_example" and
// "./cmd/dedupctl": a sequence whose later commands read what the first
// left).
func Blocks(t testing.TB, path string, programs ...string) [][]Command {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]Command
	for _, block := range shBlock.FindAllStringSubmatch(string(data), -1) {
		var cmds []Command
		has := map[string]bool{}
		for _, line := range strings.Split(block[1], "\n") {
			f := shellFields(line)
			if len(f) < 3 || f[0] != "go" || f[1] != "run" {
				continue
			}
			cmds = append(cmds, Command{path, line, f[2], f[3:]})
			has[f[2]] = true
		}
		all := len(cmds) > 0
		for _, p := range programs {
			all = all && has[p]
		}
		if all {
			out = append(out, cmds)
		}
	}
	return out
}

// shellFields splits a command line on blanks, honouring single quotes,
// and drops a trailing # comment.
func shellFields(line string) []string {
	var (
		fields []string
		cur    strings.Builder
		quoted bool
		inWord bool
	)
	for _, r := range line {
		switch {
		case r == '\'':
			quoted, inWord = !quoted, true
		case !quoted && r == '#' && !inWord:
			return fields
		case !quoted && (r == ' ' || r == '\t'):
			if inWord {
				fields = append(fields, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		fields = append(fields, cur.String())
	}
	return fields
}
