package doccheck

import (
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"unicode"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/reflect/protoreflect"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
)

// Key is a key of the config file, as the reference writes it: its full
// dotted path, `[]` after a list ("delegates[].tls.ca").
type Key struct {
	// Path is the dotted path.
	Path string
	// Container says the key's value is only a mapping (or a list of
	// mappings) of other keys: the reference documents those, so that it
	// need not document the container itself. A key that also takes a
	// value of its own (tls: true) is no container.
	Container bool
}

// ParserKeys returns the keys `serve -config` takes, sorted: those of
// delegates.Config, read by reflection from the yaml tags of its types
// and, for a preset's control, from the stubborn.v1 spec message's fields
// (proto names), nested messages followed to their last field. A type that
// reads itself (yaml.Unmarshaler) has keys no tag says; the few the config
// holds are described here, and a new one is an error, so that the
// reference cannot miss its keys.
func ParserKeys() ([]Key, error) {
	w := keyWalker{seen: map[string]bool{}}
	w.structKeys(reflect.TypeFor[delegates.Config](), "")
	if w.err != nil {
		return nil, w.err
	}
	sort.Slice(w.keys, func(i, j int) bool { return w.keys[i].Path < w.keys[j].Path })
	return w.keys, nil
}

type keyWalker struct {
	keys []Key
	seen map[string]bool
	// visiting are the messages messageKeys is inside.
	visiting map[protoreflect.FullName]bool
	err      error
}

func (w *keyWalker) add(path string, container bool) {
	if !w.seen[path] {
		w.seen[path] = true
		w.keys = append(w.keys, Key{Path: path, Container: container})
	}
}

func join(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}

var unmarshaler = reflect.TypeFor[yaml.Unmarshaler]()

// structKeys adds the keys of struct t under prefix.
func (w *keyWalker) structKeys(t reflect.Type, prefix string) {
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		switch {
		case name == "-":
			continue
		case slices.Contains(strings.Split(opts, ","), "inline"):
			w.structKeys(f.Type, prefix)
			continue
		case name == "":
			// yaml.v3's default: the field's name, lowercased.
			name = strings.ToLower(f.Name)
		}
		w.valueKeys(f.Type, join(prefix, name))
	}
}

// valueKeys adds the key path, whose value has type t, and what it holds.
func (w *keyWalker) valueKeys(t reflect.Type, path string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if reflect.PointerTo(t).Implements(unmarshaler) {
		w.selfReading(t, path)
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		w.add(path, true)
		w.structKeys(t, path)
	case reflect.Slice, reflect.Array:
		e := t.Elem()
		for e.Kind() == reflect.Pointer {
			e = e.Elem()
		}
		if e.Kind() == reflect.Struct || reflect.PointerTo(e).Implements(unmarshaler) {
			w.add(path, true)
			w.valueKeys(e, path+"[]")
			return
		}
		w.add(path, false)
	default:
		// Scalars, and maps (headers): their keys are the user's.
		w.add(path, false)
	}
}

// selfReading adds the keys of a type whose UnmarshalYAML reads it.
func (w *keyWalker) selfReading(t reflect.Type, path string) {
	switch t {
	case reflect.TypeFor[delegates.Duration]():
		w.add(path, false)
	case reflect.TypeFor[delegates.TLS]():
		// `tls: true|false`, or a mapping of the fields but Enabled,
		// which the mapping's presence means.
		w.add(path, false)
		for i := range t.NumField() {
			if f := t.Field(i); f.IsExported() && f.Name != "Enabled" {
				w.add(join(path, snake(f.Name)), false)
			}
		}
	case reflect.TypeFor[delegates.Preset]():
		// Its name and one control: a field of ControlSpec's oneof,
		// written with its message's fields.
		w.add(path, true)
		w.add(join(path, "name"), false)
		w.structKeys(reflect.TypeFor[delegates.SpendLimit](), join(path, "spend_limit"))
		w.messageKeys((&stubbornv1.ControlSpec{}).ProtoReflect().Descriptor(), path)
		w.valueKeys(reflect.TypeFor[[]delegates.NotifyTarget](), join(path, "notify")) // and its notify targets
	default:
		w.err = fmt.Errorf("%s (at %s) reads itself with UnmarshalYAML: doccheck does not know its keys; describe them in keyWalker.selfReading", t, path)
	}
}

// messageKeys adds the fields of message d under prefix: a message field
// is a container of its own fields, but the well-known types
// (google.protobuf.Duration…), which a preset writes as scalars.
func (w *keyWalker) messageKeys(d protoreflect.MessageDescriptor, prefix string) {
	if w.visiting == nil {
		w.visiting = map[protoreflect.FullName]bool{}
	}
	w.visiting[d.FullName()] = true
	defer delete(w.visiting, d.FullName())
	for i := range d.Fields().Len() {
		f := d.Fields().Get(i)
		path := join(prefix, string(f.Name()))
		m := f.Message()
		if m == nil || f.IsMap() || strings.HasPrefix(string(m.FullName()), "google.protobuf.") {
			w.add(path, false)
			continue
		}
		w.add(path, true)
		if f.IsList() {
			path += "[]"
			w.add(path, true)
		}
		if !w.visiting[m.FullName()] { // a recursive message is followed once
			w.messageKeys(m, path)
		}
	}
}

// snake is a Go field name as a YAML key: ServerName → server_name, CA → ca.
func snake(name string) string {
	r := []rune(name)
	var b strings.Builder
	for i, c := range r {
		if unicode.IsUpper(c) && i > 0 && (unicode.IsLower(r[i-1]) || i+1 < len(r) && unicode.IsLower(r[i+1])) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToLower(c))
	}
	return b.String()
}

// DocKey is a key a reference documents.
type DocKey struct {
	// Path is the key as written, without its backticks.
	Path string
	// Line is the 1-based line of its table row.
	Line int
}

var (
	tableRow  = regexp.MustCompile(`^\s*\|(.*)$`)
	separator = regexp.MustCompile(`^[\s|:-]+$`)
	backticks = regexp.MustCompile("^`([^`]+)`$")
)

// DocumentedKeys returns the keys the markdown src documents: the first
// cell of every table row that is one backticked word. A header row ("Key")
// or a first cell of prose is no key.
func DocumentedKeys(src []byte) []DocKey {
	var keys []DocKey
	inFence := false
	for i, line := range strings.Split(string(src), "\n") {
		t := strings.TrimSpace(line)
		if strings.HasPrefix(t, "```") || strings.HasPrefix(t, "~~~") {
			inFence = !inFence
			continue
		}
		m := tableRow.FindStringSubmatch(line)
		if inFence || m == nil || separator.MatchString(t) {
			continue
		}
		cell, _, _ := strings.Cut(m[1], "|")
		if k := backticks.FindStringSubmatch(strings.TrimSpace(cell)); k != nil {
			keys = append(keys, DocKey{Path: strings.TrimSpace(k[1]), Line: i + 1})
		}
	}
	return keys
}

// CompareKeys returns what file, the reference, gets wrong about the
// parser's keys: a key it documents that the parser does not take (or
// documents twice), and a key the parser takes that it does not document.
// A container is documented by its own row or by any key under it.
func CompareKeys(file string, parser []Key, documented []DocKey) []error {
	byPath := map[string]Key{}
	for _, k := range parser {
		byPath[k.Path] = k
	}
	var errs []error
	at := map[string]int{}
	for _, d := range documented {
		if first, dup := at[d.Path]; dup {
			errs = append(errs, fmt.Errorf("%s:%d: `%s` is documented twice (first on line %d)", file, d.Line, d.Path, first))
			continue
		}
		at[d.Path] = d.Line
		if _, ok := byPath[d.Path]; !ok {
			errs = append(errs, fmt.Errorf("%s:%d: `%s` is documented, but the config parser takes no such key%s", file, d.Line, d.Path, suggest(d.Path, parser)))
		}
	}
	for _, k := range parser {
		if _, ok := at[k.Path]; ok {
			continue
		}
		if k.Container && slices.ContainsFunc(documented, func(d DocKey) bool {
			return strings.HasPrefix(d.Path, k.Path+".") || strings.HasPrefix(d.Path, k.Path+"[]")
		}) {
			continue
		}
		errs = append(errs, fmt.Errorf("%s: the config parser takes `%s`, which has no row: add one (| `%s` | … |)", file, k.Path, k.Path))
	}
	return errs
}

// suggest names the parser's key that path most likely means: the same
// key with its lists marked (delegates.name → delegates[].name), or one
// ending the same way.
func suggest(path string, parser []Key) string {
	bare := strings.ReplaceAll(path, "[]", "")
	last := path[strings.LastIndexByte(path, '.')+1:]
	var same []string
	for _, k := range parser {
		if strings.ReplaceAll(k.Path, "[]", "") == bare {
			return fmt.Sprintf(" (did you mean `%s`?)", k.Path)
		}
		if strings.HasSuffix(k.Path, "."+last) || k.Path == last {
			same = append(same, "`"+k.Path+"`")
		}
	}
	if len(same) > 0 && len(same) <= 4 {
		return fmt.Sprintf(" (keys named %s: %s)", last, strings.Join(same, ", "))
	}
	return ""
}
