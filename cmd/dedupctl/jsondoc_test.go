package main

import (
	"encoding/json"
	"math"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/internal/testkit/anystore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// docField is a field of a JSON object as the README documents it.
type docField struct {
	typ    string // string, integer, number, boolean, time, an object's name, "array of T"
	always bool
}

// jsonObjects are the objects -json writes, by the README's names: the
// commands' answers and the objects they hold.
var jsonObjects = map[string]reflect.Type{
	"get":     reflect.TypeFor[recordJSON](),
	"list":    reflect.TypeFor[listJSON](),
	"forget":  reflect.TypeFor[removeResult](),
	"release": reflect.TypeFor[removeResult](),
	"stats":   reflect.TypeFor[statsJSON](),
	"purge":   reflect.TypeFor[purgeJSON](),
	"window":  reflect.TypeFor[windowView](),
	"record":  reflect.TypeFor[recordJSON](),
	"skipped": reflect.TypeFor[skipped](),
	"scope":   reflect.TypeFor[scopeJSON](),
	"storage": reflect.TypeFor[windowStorage](),
}

// objectName is the README's name of a nested object's type.
func objectName(t reflect.Type) string {
	for _, name := range []string{"record", "skipped", "scope", "storage"} {
		if jsonObjects[name] == t {
			return name
		}
	}
	return ""
}

// jsonType is the README's type of a Go type as encoding/json writes it.
func jsonType(t *testing.T, typ reflect.Type) string {
	t.Helper()
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	switch {
	case typ == reflect.TypeFor[time.Time]():
		return "time"
	case typ.Kind() == reflect.String:
		return "string"
	case typ.Kind() == reflect.Bool:
		return "boolean"
	case typ.Kind() == reflect.Int || typ.Kind() == reflect.Int64:
		return "integer"
	case typ.Kind() == reflect.Float64:
		return "number"
	case typ.Kind() == reflect.Slice:
		return "array of " + jsonType(t, typ.Elem())
	case typ.Kind() == reflect.Struct && objectName(typ) != "":
		return objectName(typ)
	}
	t.Fatalf("no README type for %s", typ)
	return ""
}

// goFields are the JSON fields of a struct type, its embedded structs'
// included.
func goFields(t *testing.T, typ reflect.Type) map[string]docField {
	t.Helper()
	out := map[string]docField{}
	for i := range typ.NumField() {
		f := typ.Field(i)
		tag, ok := f.Tag.Lookup("json")
		if f.Anonymous && !ok {
			for k, v := range goFields(t, f.Type) {
				out[k] = v
			}
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if !f.IsExported() || name == "-" || name == "" {
			t.Fatalf("%s.%s has no JSON name", typ, f.Name)
		}
		out[name] = docField{jsonType(t, f.Type), !strings.Contains(opts, "omitempty")}
	}
	return out
}

// readmeJSON parses the README's table of dedupctl's JSON output.
func readmeJSON(t *testing.T) map[string]map[string]docField {
	t.Helper()
	data, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	const header = "| object | field | type | present | meaning |"
	_, table, ok := strings.Cut(string(data), header+"\n|---|---|---|---|---|\n")
	if !ok {
		t.Fatalf("the README has no table of the JSON output (%q)", header)
	}
	code := regexp.MustCompile("`([^`]*)`")
	names := func(cell string) []string {
		var out []string
		for _, m := range code.FindAllStringSubmatch(cell, -1) {
			out = append(out, m[1])
		}
		return out
	}
	doc := map[string]map[string]docField{}
	for line := range strings.Lines(table) {
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
		if len(cells) != 5 {
			t.Fatalf("README JSON table: a row of %d cells: %s", len(cells), line)
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		for _, obj := range names(cells[0]) {
			if doc[obj] == nil {
				doc[obj] = map[string]docField{}
			}
			if strings.HasPrefix(cells[1], "the fields of a ") {
				// get: a record.
				doc[obj] = doc[names(cells[1])[0]]
				continue
			}
			for _, f := range names(cells[1]) {
				if _, dup := doc[obj][f]; dup {
					t.Fatalf("README JSON table: %s.%s twice", obj, f)
				}
				doc[obj][f] = docField{strings.ReplaceAll(cells[2], "`", ""), cells[3] == "always"}
			}
		}
	}
	// A row "the fields of a `record`" may come before the record's rows.
	for obj, typ := range jsonObjects {
		if typ == jsonObjects["record"] {
			doc[obj] = doc["record"]
		}
	}
	return doc
}

// The README documents every field -json writes, with its type and
// whether it is always there (#23).
func TestJSONDocumented(t *testing.T) {
	doc := readmeJSON(t)
	for obj, typ := range jsonObjects {
		got, want := doc[obj], goFields(t, typ)
		if got == nil {
			t.Errorf("the README's JSON table has no object %q", obj)
			continue
		}
		for name, w := range want {
			switch d, ok := got[name]; {
			case !ok:
				t.Errorf("the README's JSON table lacks %s.%s (%s)", obj, name, w.typ)
			case d.typ != w.typ:
				t.Errorf("the README gives %s.%s the type %q; -json writes %q", obj, name, d.typ, w.typ)
			case d.always != w.always:
				t.Errorf("the README says %s.%s is present always: %v; -json: %v", obj, name, d.always, w.always)
			}
		}
		for name := range got {
			if _, ok := want[name]; !ok {
				t.Errorf("the README's JSON table has %s.%s, which -json does not write", obj, name)
			}
		}
	}
	for obj := range doc {
		if _, ok := jsonObjects[obj]; !ok {
			t.Errorf("the README's JSON table has an object %q that -json does not write", obj)
		}
	}

	// What the commands write, on a SQLite file and (with its prefix)
	// Redis, matches it.
	e := &env{}
	check := func(tg *target, obj string, code int, args ...string) {
		t.Helper()
		r := tg.run(t, append(args, "-json")...).want(t, code)
		var v any
		if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
			t.Fatalf("%v -json: %v\n%s", args, err, r)
		}
		conforms(t, doc, strings.Join(args, " "), obj, docField{typ: obj, always: true}, v)
	}
	for _, kind := range []anystore.StoreKind{anystore.StoreSQLite, anystore.StoreRedis} {
		tg := e.open(t, kind, "")
		scope := "json-" + storetest.NewID()
		tg.claim(t, scope, "p1", time.Minute)
		tg.done(t, scope, "d1")
		tg.done(t, scope, "d2")
		id := tg.listed(t)[0].ID
		check(tg, "get", exitOK, "get", scope, "p1")
		check(tg, "get", exitOK, "get", "-id="+id)
		check(tg, "list", exitOK, "list", "-limit=1")
		check(tg, "stats", exitOK, "stats")
		check(tg, "purge", exitOK, "purge")
		check(tg, "release", exitRefused, "release", scope, "p1")
		check(tg, "release", exitOK, "release", scope, "p1", "-yes")
		check(tg, "forget", exitOK, "forget", scope, "d1", "-yes")
		if tg.scopes {
			check(tg, "forget", exitOK, "forget", scope, "-all", "-yes")
		}
	}
	window := &target{}
	check(window, "window", exitOK, "window", "-horizon=1h", "-rate=10")
	check(window, "window", exitOK, "window", "-horizon=1h", "-rate=10", "-bytes-per-record=100")
	check(window, "window", exitOK, "window", "-horizon=1h")
}

// conforms checks that v, the JSON value of the field f of an object
// (what names it in errors), is what the README documents.
func conforms(t *testing.T, doc map[string]map[string]docField, what, obj string, f docField, v any) {
	t.Helper()
	bad := func() { t.Fatalf("%s: %s is %T %v, the README says %s", what, obj, v, v, f.typ) }
	switch typ := f.typ; {
	case strings.HasPrefix(typ, "array of "):
		a, ok := v.([]any)
		if !ok {
			bad()
		}
		for _, el := range a {
			conforms(t, doc, what, obj+"[]", docField{typ: strings.TrimPrefix(typ, "array of ")}, el)
		}
	case typ == "string":
		if _, ok := v.(string); !ok {
			bad()
		}
	case typ == "time":
		s, ok := v.(string)
		if _, err := time.Parse(time.RFC3339Nano, s); !ok || err != nil || !strings.HasSuffix(s, "Z") {
			bad()
		}
	case typ == "boolean":
		if _, ok := v.(bool); !ok {
			bad()
		}
	case typ == "integer":
		n, ok := v.(float64)
		if !ok || n != math.Trunc(n) {
			bad()
		}
	case typ == "number":
		if _, ok := v.(float64); !ok {
			bad()
		}
	default: // an object
		fields, ok := doc[typ]
		m, isMap := v.(map[string]any)
		if !ok || !isMap {
			bad()
		}
		for name, df := range fields {
			if _, present := m[name]; df.always && !present {
				t.Fatalf("%s: %s lacks %q, which the README says is always there: %v", what, obj, name, m)
			}
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			df, ok := fields[k]
			if !ok {
				t.Fatalf("%s: %s has %q, which the README does not document", what, obj, k)
			}
			conforms(t, doc, what, obj+"."+k, df, m[k])
		}
	}
}
