package notify

import (
	"context"
	"time"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
)

// sweepLoop queues the notices of the runs that await a decision, at the
// start and every SweepEvery: what the Observer handed off and this
// process did not queue before it stopped (a crash), or a replica that
// died did not, is queued then. A notice queued before is not queued
// again (the queue keeps its key while it is settled).
func (n *Notifier) sweepLoop() {
	defer n.wg.Done()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
		if err := n.sweep(n.ctx); err != nil && n.ctx.Err() == nil {
			n.log.Warn("notify: looking for runs awaiting a decision", "err", err)
		}
		t.Reset(n.cfg.SweepEvery)
	}
}

// sweep queues the notice of every run awaiting a decision whose tenant
// or presets list a target.
func (n *Notifier) sweep(ctx context.Context) error {
	var waiting []*stubbornv1.ControlState
	err := n.cfg.States(ctx, func(st *stubbornv1.ControlState) bool {
		if st.GetStatus() == stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION &&
			len(n.cfg.Targets(st.GetTenant(), delegates.References(st.GetControl()))) > 0 {
			waiting = append(waiting, st)
		}
		return ctx.Err() == nil
	})
	if err != nil {
		return err
	}
	for _, st := range waiting {
		ev, err := n.pendingRequest(ctx, st.GetRunId())
		if err != nil || ev == nil {
			continue // decided meanwhile, or out of reach until the next sweep
		}
		if err := n.queue(ctx, handed{ev: ev, tenant: st.GetTenant(), presets: delegates.References(st.GetControl())}); err != nil {
			return err
		}
	}
	return nil
}

// pendingRequest returns the decision_requested the run awaits an answer
// to, or nil when it awaits none.
func (n *Notifier) pendingRequest(ctx context.Context, id string) (*stubbornv1.RunEvent, error) {
	evs, err := n.cfg.Events(ctx, id, 0)
	if err != nil {
		return nil, err
	}
	for i := len(evs) - 1; i >= 0; i-- {
		switch {
		case evs[i].GetDecisionRequested() != nil:
			return evs[i], nil
		case evs[i].GetDecisionReceived() != nil, evs[i].GetRunFinished() != nil:
			return nil, nil
		}
	}
	return nil, nil
}
