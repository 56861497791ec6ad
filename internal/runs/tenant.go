package runs

import (
	"context"
	"fmt"
	"slices"
)

// Every run belongs to the tenant that started it (ControlState.tenant),
// and the Manager shows it to that tenant only. The tenant comes from the
// context of each call: the server's authentication puts it there with
// WithTenant. A context without one is the default tenant "", which is what
// every caller is on a server without authentication.
//
// A run of another tenant is reported exactly like a run that does not
// exist: the same ErrNotFound, with the same message, so that a caller
// cannot learn that another tenant's run exists.

type tenantKey struct{}

// WithTenant returns a child of ctx on behalf of tenant: the runs it starts
// belong to tenant, and it sees only tenant's runs.
func WithTenant(ctx context.Context, tenant string) context.Context {
	return context.WithValue(ctx, tenantKey{}, tenant)
}

// TenantFrom returns the tenant ctx acts for; "" (the default tenant) when
// none was set.
func TenantFrom(ctx context.Context) string {
	t, _ := ctx.Value(tenantKey{}).(string)
	return t
}

type defaultRunsKey struct{}

// WithDefaultRuns returns a child of ctx whose tenant also owns the
// default tenant's runs: those started while the server had no tenants
// (a config's tenant with default_runs). It sees, lists, follows, decides,
// cancels and deletes them as its own; the runs it starts are its own.
func WithDefaultRuns(ctx context.Context) context.Context {
	return context.WithValue(ctx, defaultRunsKey{}, true)
}

// Owners returns the tenants whose runs ctx owns: its own, and the
// default tenant "" after it when ctx took the default tenant's runs
// (WithDefaultRuns).
func Owners(ctx context.Context) []string {
	t := TenantFrom(ctx)
	if adopted, _ := ctx.Value(defaultRunsKey{}).(bool); adopted && t != "" {
		return []string{t, ""}
	}
	return []string{t}
}

// owns reports whether a run of tenant owner is ctx's.
func owns(ctx context.Context, owner string) bool {
	return slices.Contains(Owners(ctx), owner)
}

// notFound is the error for a run that does not exist, or that exists but
// belongs to another tenant: word for word what the stores say about an
// unknown id.
func notFound(id string) error {
	return fmt.Errorf("%w: %q", ErrNotFound, id)
}

// visible returns notFound unless a run of tenant owner may be seen from
// ctx.
func visible(ctx context.Context, id, owner string) error {
	if !owns(ctx, owner) {
		return notFound(id)
	}
	return nil
}
