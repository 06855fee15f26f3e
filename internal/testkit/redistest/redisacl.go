package redistest

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// The ACL rules the docs give the Redis store's user: the lines of
// stores/redisstore/README.md that start with aclRulePrefix, the first
// the least privilege, then any alternatives. The root README's Security
// section shows the same lines.
const aclRulePrefix = "ACL SETUSER dedup "

// RedisACLRules returns the ACL rules the docs give the store's user,
// each the words after "ACL SETUSER dedup", as written ("on",
// ">PASSWORD", "~dedup:*", ...). It fails t when the READMEs show none,
// or differ.
func RedisACLRules(t testing.TB) [][]string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot find the module's directory")
	}
	root := filepath.Join(filepath.Dir(file), "..", "..", "..") // internal/testkit/redistest/redisacl.go
	read := func(path string) []string {
		t.Helper()
		data, err := os.ReadFile(filepath.Join(root, path))
		if err != nil {
			t.Fatal(err)
		}
		var rules []string
		for _, line := range strings.Split(string(data), "\n") {
			if line = strings.TrimSpace(line); strings.HasPrefix(line, aclRulePrefix) {
				rules = append(rules, line)
			}
		}
		return rules
	}
	rules := read("stores/redisstore/README.md")
	if len(rules) == 0 {
		t.Fatalf("stores/redisstore/README.md shows no %q line", aclRulePrefix)
	}
	if root := read("README.md"); !slices.Equal(root, rules) {
		t.Fatalf("README.md's ACL rules differ from stores/redisstore/README.md's:\n%s\nand\n%s", strings.Join(root, "\n"), strings.Join(rules, "\n"))
	}
	out := make([][]string, len(rules))
	for i, r := range rules {
		out[i] = strings.Fields(strings.TrimPrefix(r, aclRulePrefix))
	}
	return out
}

// SetRedisACLUser makes user, with password, on the Redis node behind
// admin (a private one: never the shared Redis), by rule, one of
// RedisACLRules, for the store's key prefix: its ">PASSWORD" is password,
// its "~dedup:*" is "~prefix*" (prefix holding no glob character).
func SetRedisACLUser(t testing.TB, admin *redis.Client, rule []string, user, password, prefix string) {
	t.Helper()
	if strings.ContainsAny(prefix, `*?[]\`) {
		t.Fatalf("prefix %q has a glob character", prefix)
	}
	args := []any{"ACL", "SETUSER", user, "reset"}
	sawPassword, sawKeys := false, false
	for _, w := range rule {
		switch w {
		case ">PASSWORD":
			w, sawPassword = ">"+password, true
		case "~dedup:*":
			w, sawKeys = "~"+prefix+"*", true
		}
		args = append(args, w)
	}
	if !sawPassword || !sawKeys {
		t.Fatalf("the ACL rule %q has no >PASSWORD or no ~dedup:*", rule)
	}
	if err := admin.Do(context.Background(), args...).Err(); err != nil {
		t.Fatalf("ACL SETUSER %s with %q: %v", user, rule, err)
	}
}
