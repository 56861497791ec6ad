package delegates

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// This file helps decodeError name the field an error is about, and guess
// the key meant by an unknown one.

// nodeError is a decoding error about node n, or about sub (a dotted path
// such as "retry.max_wait") within it, found on line. decodeError names
// the path of n (the key whose value n is, or the list entry n is),
// followed by sub: a Duration knows only its own node, a Preset not where
// it is in the file.
func nodeError(n *yaml.Node, sub string, line int, msg string) *yaml.TypeError {
	if sub != "" {
		sub = " " + sub
	}
	return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: at %d:%d%s: %s", line, n.Line, n.Column, sub, msg)}}
}

// unknownKey is the error about key k, which is not one of typ's keys,
// worded as yaml.v3 words it, so that decodeError names the key and
// guesses the one meant (typ is a name knownKeys knows).
func unknownKey(k *yaml.Node, typ string) string {
	return fmt.Sprintf("line %d: field %s not found in type %s", k.Line, k.Value, typ)
}

// locateBy returns the path (such as `delegates[1] ("search").timeout`)
// of the first node, outermost first, that match accepts: a mapping's
// value (k its key) or a list's entry (k nil), at path.
func locateBy(n *yaml.Node, path string, match func(path string, k, v *yaml.Node) bool) (string, bool) {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			if p, ok := locateBy(c, path, match); ok {
				return p, true
			}
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := k.Value
			if path != "" {
				p = path + "." + k.Value
			}
			if match(p, k, v) {
				return p, true
			}
			if sub, ok := locateBy(v, p, match); ok {
				return sub, true
			}
		}
	case yaml.SequenceNode:
		for i, item := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			if name := mappingValue(item, "name"); name != "" {
				p += fmt.Sprintf(" (%q)", name)
			}
			if match(p, nil, item) {
				return p, true
			}
			if sub, ok := locateBy(item, p, match); ok {
				return sub, true
			}
		}
	}
	return "", false
}

// locateAt returns the path of the node at line and column.
func locateAt(root *yaml.Node, line, column int) (string, bool) {
	return locateBy(root, "", func(_ string, _, v *yaml.Node) bool { return v.Line == line && v.Column == column })
}

// locateValue returns the path of the key whose scalar value, on line,
// is value (or, when it ends with "...", begins with what is before).
func locateValue(root *yaml.Node, line int, value string) (string, bool) {
	prefix, cut := strings.CutSuffix(value, "...")
	return locateBy(root, "", func(_ string, k, v *yaml.Node) bool {
		return k != nil && v.Kind == yaml.ScalarNode && v.Line == line &&
			(v.Value == value || cut && strings.HasPrefix(v.Value, prefix))
	})
}

// didYouMean is ` (did you mean "x"?)` for the key of typ closest to key,
// when one is close (Closest), else "".
func didYouMean(key, typ string) string {
	if best := Closest(key, knownKeys(typ)); best != "" {
		return fmt.Sprintf(" (did you mean %q?)", best)
	}
	if typ == "delegates.Preset" && slices.Contains(knownKeys("delegates.Delegate"), key) {
		return fmt.Sprintf(" (a delegate's key: a preset is a name and one of %s; is this entry meant for delegates?)", strings.Join(controlKeys, ", "))
	}
	return ""
}

// configKeys maps the name of each type of the config file, as yaml.v3
// writes it in an error ("delegates.Delegate"), to its keys.
var configKeys = sync.OnceValue(func() map[string][]string {
	keys := map[string][]string{
		"delegates.TLS":    tlsKeys,
		"delegates.Preset": append([]string{"name"}, controlKeys...),
	}
	addKeys(keys, reflect.TypeFor[Config]())
	return keys
})

// knownKeys returns the keys of the config type named typ: a Go type of
// this package's, or a control's proto message in a preset
// ("stubborn.v1.RetrySpec"). Nil for a name it does not know.
func knownKeys(typ string) []string {
	if keys, ok := configKeys()[typ]; ok {
		return keys
	}
	for _, m := range controlMessages {
		if d := m.ProtoReflect().Descriptor(); string(d.FullName()) == typ {
			return fieldNames(d)
		}
	}
	return nil
}

// fieldNames are a proto message's field names, as a preset writes them.
func fieldNames(d protoreflect.MessageDescriptor) []string {
	names := make([]string, d.Fields().Len())
	for i := range names {
		names[i] = string(d.Fields().Get(i).Name())
	}
	return names
}

// addKeys adds t's keys to keys, and those of the struct types its fields
// hold, but not of the types that read themselves (yaml.Unmarshaler).
func addKeys(keys map[string][]string, t reflect.Type) {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || keys[t.String()] != nil || reflect.PointerTo(t).Implements(reflect.TypeFor[yaml.Unmarshaler]()) {
		return
	}
	keys[t.String()] = structKeys(keys, t)
}

// structKeys returns struct t's keys (an inline struct's included), and
// adds its fields' types to keys.
func structKeys(keys map[string][]string, t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		switch {
		case name == "-":
			continue
		case strings.Contains(opts, "inline"):
			out = append(out, structKeys(keys, f.Type)...)
			continue
		case name == "":
			name = strings.ToLower(f.Name)
		}
		out = append(out, name)
		addKeys(keys, f.Type)
	}
	return out
}
