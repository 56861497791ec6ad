package server

import (
	"context"
	"errors"
	"net/http"
	"net/url"

	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/notify"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// NotifyConfig is how a server tells people that runs wait for them
// (docs/notifications.md): the config's notify targets get signed
// notices, whose decision links the HTTP listener serves.
type NotifyConfig struct {
	// PublicURL is the base URL people reach the HTTP listener at (serve
	// -public-url). A config with notify targets needs it.
	PublicURL string
	// Queue keeps the notices: notify.OpenKV on a JetStream store, nil
	// for one in process (a memory store's runs).
	Queue notify.Queue
	// Tune, when set, changes the notifier's config before it starts
	// (tests: shorter waits).
	Tune func(*notify.Config)
}

// newNotifier makes the notifier when the config lists targets or a
// public URL is set (a reload may add targets), and makes it see the
// runs (rc.Observer, wrapped).
func (s *Stubborn) newNotifier(cfg Config, regs *registries, rc *runs.Config) error {
	if err := checkNotify(cfg.Registry, cfg.Notify.PublicURL); err != nil {
		return err
	}
	if cfg.Notify.PublicURL == "" {
		return nil
	}
	q := cfg.Notify.Queue
	if q == nil {
		q = notify.NewMemory()
	}
	st := rc.Store
	nc := notify.Config{
		PublicURL: cfg.Notify.PublicURL, Queue: q, Owner: rc.Owner, Logger: s.logger,
		Targets: func(tenant string, presets []string) []delegates.NotifyTarget {
			return notifyTargets(regs.current().cfg, tenant, presets)
		},
		Secret: func(u, env string) (string, bool) { return notifySecret(regs.current().cfg, u, env) },
		Events: func(ctx context.Context, id string, after int64) ([]*stubbornv1.RunEvent, error) {
			return decodeEvents(st, ctx, id, after)
		},
		States: st.States,
	}
	if cfg.Clock != nil {
		nc.Now = cfg.Clock.Now
	}
	if cfg.Notify.Tune != nil {
		cfg.Notify.Tune(&nc)
	}
	n, err := notify.New(nc)
	if err != nil {
		return err
	}
	s.notifier = n
	rc.Observer = n.Observer(rc.Observer)
	return nil
}

// checkNotify refuses notify targets without a public URL to build their
// links on.
func checkNotify(reg *delegates.Config, publicURL string) error {
	if publicURL != "" {
		return notify.CheckPublicURL(publicURL)
	}
	if reg != nil && reg.HasNotify() {
		return errors.New("the config lists notify targets, and serve has no -public-url: the base URL people reach the HTTP listener at, which the decision links are built on")
	}
	return nil
}

// startNotifier starts delivering, deciding through m.
func (s *Stubborn) startNotifier(m *runs.Manager) {
	if s.notifier != nil {
		s.notifier.Start(m)
	}
}

// stopNotifier stops delivering; what is left stays queued.
func (s *Stubborn) stopNotifier() {
	if s.notifier != nil {
		s.notifier.Close()
	}
}

// routeDecide serves the decision links on mux.
func (s *Stubborn) routeDecide(mux *http.ServeMux) {
	if s.notifier != nil {
		mux.Handle(notify.DecidePath, s.notifier.Handler())
	}
}

// publicHosts is the public URL's host, which the HTTP listener answers
// besides its own (the decision links are opened there).
func (s *Stubborn) publicHosts() []string {
	u, err := url.Parse(s.publicURL)
	if err != nil || u.Host == "" {
		return nil
	}
	return []string{u.Host}
}

// notifyTargets are the targets of a run of tenant whose control names
// presets at its top: the tenant's (the config's own for the default
// tenant) and the presets', each once.
func notifyTargets(cfg *delegates.Config, tenant string, presets []string) []delegates.NotifyTarget {
	var out []delegates.NotifyTarget
	seen := map[[2]string]bool{}
	add := func(ts []delegates.NotifyTarget) {
		for _, t := range ts {
			if k := [2]string{t.URL, t.SecretEnv}; !seen[k] {
				seen[k] = true
				out = append(out, t)
			}
		}
	}
	if tenant == "" {
		add(cfg.Notify)
	}
	for _, t := range cfg.Tenants {
		if t.Name == tenant && tenant != "" {
			add(t.Notify)
		}
	}
	for _, p := range cfg.Presets {
		for _, name := range presets {
			if p.Name == name {
				add(p.Notify)
			}
		}
	}
	return out
}

// notifySecret finds the secret of target u, env in cfg.
func notifySecret(cfg *delegates.Config, u, env string) (string, bool) {
	lists := [][]delegates.NotifyTarget{cfg.Notify}
	for _, t := range cfg.Tenants {
		lists = append(lists, t.Notify)
	}
	for _, p := range cfg.Presets {
		lists = append(lists, p.Notify)
	}
	for _, l := range lists {
		for _, t := range l {
			if t.URL == u && t.SecretEnv == env && t.Secret() != "" {
				return t.Secret(), true
			}
		}
	}
	return "", false
}

// decodeEvents reads run id's journal after seq after.
func decodeEvents(st store.Store, ctx context.Context, id string, after int64) ([]*stubbornv1.RunEvent, error) {
	evs, err := st.Events(ctx, id, after)
	if err != nil {
		return nil, err
	}
	out := make([]*stubbornv1.RunEvent, 0, len(evs))
	for _, e := range evs {
		ev := &stubbornv1.RunEvent{}
		if err := proto.Unmarshal(e.Data, ev); err != nil {
			return nil, err
		}
		out = append(out, ev)
	}
	return out, nil
}
