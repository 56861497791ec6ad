package main

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"go.yaml.in/yaml/v3"

	"github.com/stubbornhq/stubborn/internal/delegates"
)

// reloadSettle is how long the config's directory must be quiet after a
// change before the file is read again: an editor or a deployment tool
// writes, renames and links in several steps.
const reloadSettle = 200 * time.Millisecond

// reloader applies the config file to a running server again, on SIGHUP
// and (with -watch-config) when the file changes.
type reloader struct {
	path   string
	sec    *securityFlags
	logger *slog.Logger
	apply  func(*delegates.Config) error

	mu sync.Mutex
	// sum is the SHA-256 of the file as last applied (or refused): a
	// change event that leaves the content as it was reloads nothing.
	sum     [sha256.Size]byte
	current *delegates.Config
}

// reload reads the file and applies it whole, or keeps the config in use
// and logs why. force reloads even if the file is as last read (SIGHUP:
// the operator asked, and a reload also reads delegates' TLS files again).
func (r *reloader) reload(why string, force bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, err := os.ReadFile(r.path)
	if err != nil {
		r.logger.Error("config not reloaded: keeping the one in use", "config", r.path, "why", why, "err", err)
		return
	}
	sum := sha256.Sum256(b)
	if !force && bytes.Equal(sum[:], r.sum[:]) {
		return
	}
	cfg, err := delegates.ParseAt(b, r.path) // tls paths relative to the file, as at the start
	if err == nil {
		// Never loosen by accident: a file cut short, or without its
		// delegates or tenants, is refused (delegates.Config.CheckReplaces).
		err = cfg.CheckReplaces(r.current)
	}
	if err == nil {
		err = r.sec.checkTenants(cfg)
	}
	if err == nil {
		err = r.apply(cfg)
	}
	if err != nil {
		r.logger.Error("config not reloaded: keeping the one in use", "config", r.path, "why", why, "err", err)
		return
	}
	// Only a config applied counts as read: one refused is tried again at
	// the next change, even if only a file it names (a TLS CA) changed.
	r.sum = sum
	added, removed := diffNames(delegateNames(r.current), delegateNames(cfg))
	var changed, pAdded, pRemoved, pChanged []string
	if r.current != nil {
		changed = changedNames(r.current.Delegates, cfg.Delegates, func(d delegates.Delegate) string { return d.Name })
		pAdded, pRemoved = diffNames(namesOf(r.current.Presets, presetName), namesOf(cfg.Presets, presetName))
		pChanged = changedNames(r.current.Presets, cfg.Presets, presetName)
	}
	tAdded, tRemoved := diffNames(tenantNames(r.current), tenantNames(cfg))
	if len(cfg.Tenants) == 0 && r.current != nil && len(r.current.Tenants) > 0 {
		r.logger.Warn("config reloaded with tenants: []: authentication is off, every caller is the default tenant", "config", r.path, "tenants_removed", logNames(tRemoved))
	}
	r.current = cfg
	r.logger.Info("config reloaded", "config", r.path, "why", why,
		"delegates", len(cfg.Delegates), "delegates_added", logNames(added), "delegates_removed", logNames(removed), "delegates_changed", logNames(changed),
		"presets", len(cfg.Presets), "presets_added", logNames(pAdded), "presets_removed", logNames(pRemoved), "presets_changed", logNames(pChanged),
		"tenants", len(cfg.Tenants), "tenants_added", logNames(tAdded), "tenants_removed", logNames(tRemoved))
}

// changed reports whether the file differs from what was last applied
// (or cannot be read: the reload says why).
func (r *reloader) changed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, err := os.ReadFile(r.path)
	return err != nil || sha256.Sum256(b) != r.sum
}

// notifyHUP catches SIGHUP, which would end the process by default, from
// the start of serve: the signals wait in the channel until the server is
// up and start reads them. stop ends the catching.
func notifyHUP() (hup chan os.Signal, stop func()) {
	hup = make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	return hup, func() { signal.Stop(hup) }
}

// start reloads on hup's signals and, when watch is set, on changes to the
// file's directory (the directory, not the file: editors and Kubernetes
// replace a file by a rename or a symlink swap, which a watch on the file
// loses). initial is the config in use, parsed from the bytes whose
// SHA-256 is sum. Once the watch is armed, the file is compared with those
// bytes: a file written after they were read and before the watch was
// armed is applied or refused like any later change. stop ends both.
func (r *reloader) start(hup <-chan os.Signal, initial *delegates.Config, sum [sha256.Size]byte, watch bool) (stop func()) {
	var err error
	r.current, r.sum = initial, sum
	var events chan fsnotify.Event
	var errs chan error
	var w *fsnotify.Watcher
	if watch {
		// A watch that cannot be set up (inotify's limits reached, say)
		// does not keep the server from serving: SIGHUP still reloads.
		if w, err = fsnotify.NewWatcher(); err == nil {
			if err = w.Add(filepath.Dir(r.path)); err != nil {
				_ = w.Close()
				w = nil
			}
		}
		if err != nil {
			r.logger.Warn("not watching the config file: reload it with SIGHUP", "config", r.path, "err", err)
		} else {
			events, errs = w.Events, w.Errors
		}
	}
	base := filepath.Base(r.path)
	var settle <-chan time.Time
	if events != nil && r.changed() {
		settle = time.After(reloadSettle) // it may be written still
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-hup:
				r.reload("SIGHUP", true)
			case ev := <-events:
				// The file itself, or Kubernetes' ..data symlink swap;
				// not the directory's other files.
				if name := filepath.Base(ev.Name); name == base || strings.HasPrefix(name, "..") {
					settle = time.After(reloadSettle)
				}
			case err := <-errs:
				r.logger.Warn("watching the config file", "config", r.path, "err", err)
			case <-settle:
				settle = nil
				r.reload("the file changed", false)
			case <-done:
				return
			}
		}
	}()
	return func() {
		close(done)
		wg.Wait()
		if w != nil {
			_ = w.Close()
		}
	}
}

// maxLoggedNames bounds the names a log line lists: a reload that adds
// 10,000 delegates is one line of a few hundred bytes, not 150 KB.
const maxLoggedNames = 20

// logNames is names for a log line: all of them up to maxLoggedNames,
// else the first maxLoggedNames and how many more there are.
func logNames(names []string) []string {
	if len(names) <= maxLoggedNames {
		return names
	}
	return append(slices.Clip(names[:maxLoggedNames]), fmt.Sprintf("… and %d more (%d in all)", len(names)-maxLoggedNames, len(names)))
}

func delegateNames(c *delegates.Config) []string {
	if c == nil {
		return nil
	}
	return namesOf(c.Delegates, func(d delegates.Delegate) string { return d.Name })
}

func tenantNames(c *delegates.Config) []string {
	if c == nil {
		return nil
	}
	return namesOf(c.Tenants, func(t delegates.Tenant) string { return t.Name })
}

func namesOf[T any](items []T, name func(T) string) []string {
	out := make([]string, 0, len(items))
	for _, it := range items {
		out = append(out, name(it))
	}
	return out
}

// diffNames returns the names in b not in a, and those in a not in b.
func diffNames(a, b []string) (added, removed []string) {
	for _, n := range b {
		if !slices.Contains(a, n) {
			added = append(added, n)
		}
	}
	for _, n := range a {
		if !slices.Contains(b, n) {
			removed = append(removed, n)
		}
	}
	return added, removed
}

func presetName(p delegates.Preset) string { return p.Name }

// changedNames returns the names of the items in both a and b whose
// settings differ: written as YAML (their exported settings, as the file
// has them), they are not the same.
func changedNames[T any](a, b []T, name func(T) string) []string {
	was := make(map[string][]byte, len(a))
	for _, it := range a {
		y, err := yaml.Marshal(it)
		if err == nil {
			was[name(it)] = y
		}
	}
	var changed []string
	for _, it := range b {
		old, ok := was[name(it)]
		if !ok {
			continue
		}
		if y, err := yaml.Marshal(it); err != nil || !bytes.Equal(y, old) {
			changed = append(changed, name(it))
		}
	}
	return changed
}
