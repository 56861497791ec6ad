package delegates

import (
	"fmt"
	"net/url"
	"slices"

	"go.yaml.in/yaml/v3"
)

// NotifyTarget is a webhook told when a run waits for a person (and, as
// On says, when one ends FAILED or EXHAUSTED). A tenant, a preset and the
// config (for the default tenant) may list them:
//
//	notify:
//	  - url: https://hooks.example.com/stubborn
//	    secret_env: STUBBORN_HOOK_SECRET
//	    format: json            # or slack
//	    on: [awaiting_decision, failed, exhausted]
type NotifyTarget struct {
	// URL gets a POST of each notice: http or https, at most
	// MaxNotifyURLBytes.
	URL string `yaml:"url"`
	// SecretEnv names the environment variable holding the secret the
	// notices are signed with (HMAC-SHA256, Stubborn-Signature). Required;
	// read when the config loads, refused when unset or empty, never
	// logged.
	SecretEnv string `yaml:"secret_env"`
	// Format is json (the default: Stubborn's notice) or slack (Slack's
	// incoming-webhook shape).
	Format string `yaml:"format,omitempty"`
	// On lists what the target is told of: awaiting_decision, failed,
	// exhausted. Empty means [awaiting_decision].
	On []string `yaml:"on,omitempty"`

	// secret is SecretEnv's value, read by validate.
	secret string
}

// Notice kinds a NotifyTarget's On may list.
const (
	NotifyAwaitingDecision = "awaiting_decision"
	NotifyFailed           = "failed"
	NotifyExhausted        = "exhausted"
)

// Bounds of a notify target.
const (
	// MaxNotifyURLBytes bounds a target's url.
	MaxNotifyURLBytes = 2048
	// maxNotifyTargets bounds the targets of one list.
	maxNotifyTargets = 16
	// maxNotifySecretBytes bounds a target's secret.
	maxNotifySecretBytes = 4096
)

// Secret returns the signing secret SecretEnv named when the config was
// loaded.
func (t NotifyTarget) Secret() string { return t.secret }

// WithSecret returns t signing with secret (tests, and configs built in
// code).
func (t NotifyTarget) WithSecret(secret string) NotifyTarget {
	t.secret = secret
	return t
}

// Wants reports whether t is told of kind.
func (t NotifyTarget) Wants(kind string) bool {
	if len(t.On) == 0 {
		return kind == NotifyAwaitingDecision
	}
	return slices.Contains(t.On, kind)
}

// HasNotify reports whether the config lists any notify target.
func (c *Config) HasNotify() bool {
	if len(c.Notify) > 0 {
		return true
	}
	for _, t := range c.Tenants {
		if len(t.Notify) > 0 {
			return true
		}
	}
	for _, p := range c.Presets {
		if len(p.Notify) > 0 {
			return true
		}
	}
	return false
}

// validateNotify checks every notify list (the config's, the tenants',
// the presets') and reads their secrets. Errors name the field path:
// tenants[0].notify[1].url.
func (c *Config) validateNotify(lookupEnv func(string) (string, bool), bad func(string, ...any)) {
	checkNotifyList("notify", c.Notify, lookupEnv, bad)
	for i := range c.Tenants {
		checkNotifyList(fmt.Sprintf("tenants[%d].notify", i), c.Tenants[i].Notify, lookupEnv, bad)
	}
	for i := range c.Presets {
		checkNotifyList(fmt.Sprintf("presets[%d].notify", i), c.Presets[i].Notify, lookupEnv, bad)
	}
}

// checkNotifyList validates ts, in place (secrets read).
func checkNotifyList(where string, ts []NotifyTarget, lookupEnv func(string) (string, bool), bad func(string, ...any)) {
	if len(ts) > maxNotifyTargets {
		bad("%s: at most %d targets, got %d", where, maxNotifyTargets, len(ts))
	}
	for j := range ts {
		t := &ts[j]
		field := fmt.Sprintf("%s[%d]", where, j)
		if msg := checkNotifyURL(t.URL); msg != "" {
			bad("%s.url: %s", field, msg)
		}
		switch t.Format {
		case "", "json", "slack":
		default:
			bad("%s.format: must be json or slack, got %q", field, t.Format)
		}
		for k, on := range t.On {
			switch on {
			case NotifyAwaitingDecision, NotifyFailed, NotifyExhausted:
			default:
				bad("%s.on[%d]: must be awaiting_decision, failed or exhausted, got %q", field, k, on)
			}
		}
		if t.SecretEnv == "" {
			bad("%s.secret_env: is empty: name the environment variable holding the signing secret", field)
			continue
		}
		v, ok := lookupEnv(t.SecretEnv)
		switch {
		case !ok || v == "":
			bad("%s.secret_env: environment variable %s is not set", field, t.SecretEnv)
		case len(v) > maxNotifySecretBytes:
			bad("%s.secret_env: the value of %s is over %d bytes", field, t.SecretEnv, maxNotifySecretBytes)
		default:
			t.secret = v
		}
	}
}

// checkNotifyURL reports what is wrong with a target's url, or "".
func checkNotifyURL(s string) string {
	if s == "" {
		return "is empty"
	}
	if len(s) > MaxNotifyURLBytes {
		return fmt.Sprintf("is over %d bytes", MaxNotifyURLBytes)
	}
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Sprintf("is not a URL: %v", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Sprintf("must be http or https, got %q", u.Scheme)
	}
	if u.Host == "" {
		return "has no host"
	}
	if u.User != nil {
		return "must not carry credentials (user:password@): sign with secret_env"
	}
	return ""
}

// unknownNotifyKeys reports the keys of a notify list (a YAML node) that
// NotifyTarget has not, as the config's decoder words them: a preset
// decodes its keys itself, and a node's own Decode would take them.
func unknownNotifyKeys(list *yaml.Node) []string {
	var unknown []string
	for _, item := range list.Content {
		for j := 0; item.Kind == yaml.MappingNode && j+1 < len(item.Content); j += 2 {
			switch k := item.Content[j]; k.Value {
			case "url", "secret_env", "format", "on":
			default:
				unknown = append(unknown, unknownKey(k, "delegates.NotifyTarget"))
			}
		}
	}
	return unknown
}
