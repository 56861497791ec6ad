package delegates

import (
	"reflect"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// health is a delegate's answer to a health check.
type health int

const (
	// healthServing: it said it serves, or has no health check of its own.
	healthServing health = iota
	// healthNotServing: it said it does not serve (a fallback chain skips it).
	healthNotServing
	// healthUnreachable: the check did not reach it (connection refused,
	// no answer in time); it is still called, as a serving one is.
	healthUnreachable
)

func (h health) proto() stubbornv1.DelegateHealth {
	switch h {
	case healthNotServing:
		return stubbornv1.DelegateHealth_DELEGATE_HEALTH_NOT_SERVING
	case healthUnreachable:
		return stubbornv1.DelegateHealth_DELEGATE_HEALTH_UNREACHABLE
	}
	return stubbornv1.DelegateHealth_DELEGATE_HEALTH_SERVING
}

// keepHealth copies into p what prev knew of the health of each delegate
// whose config is the same in both: a reload does not make an unchanged
// delegate's health unknown.
func (p *Pool) keepHealth(prev *Pool) {
	if prev == nil {
		return
	}
	prev.mu.Lock()
	defer prev.mu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	for name, a := range prev.health {
		old, was := prev.byKey[name]
		cur, is := p.byKey[name]
		if was && is && reflect.DeepEqual(old.cfg, cur.cfg) {
			p.health[name] = a
		}
	}
}
