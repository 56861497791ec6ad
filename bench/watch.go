package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// WatchResult is scenario 6: one run watched by many WatchRun streams.
type WatchResult struct {
	Store string `json:"store"`
	Mode  string `json:"mode"` // burst: zero waits; paced: waits in [0, pace]
	// Batch is the watchers' WatchRunRequest.max_batch (0 or 1: one event
	// per message).
	Batch    int `json:"batch,omitempty"`
	Watchers int `json:"watchers"`
	Conns    int `json:"conns"`
	Rounds   int `json:"rounds"`
	// Live events each watcher received per round (the events before the
	// gate opened are replayed from the journal and not counted).
	EventsPerWatcher int `json:"events_per_watcher"`
	Samples          int `json:"samples"`
	// Messages is how many responses carried the live events.
	Messages int     `json:"messages"`
	P50ms    float64 `json:"p50_ms"`
	P99ms    float64 `json:"p99_ms"`
	MaxMs    float64 `json:"max_ms"`
	// The time over which the run emitted its live events, per round
	// (median): how fast the events came.
	EmitMs float64 `json:"emit_ms"`
}

// gateSeq is the last event emitted before the watched delegate's first
// attempt reaches its gate: run_started (1), attempt_started (2).
const gateSeq = 2

// runWatch starts runs of the watched delegate (attempts attempts, the last
// one succeeding, waits in [0, pace]) and watches each with watchers
// WatchRun streams spread over conns connections. Each round opens the
// delegate's gate once every watcher has the events before it, so that the
// rest are delivered live; the delivery latency of an event is its receive
// time minus its event.time (one process, one clock). After a warm-up
// round, rounds repeat until dur has passed (at least one).
//
// It also returns the events of one such run, captured after the
// measurement (for the floor: runFloor).
func runWatch(ctx context.Context, w *world, store, mode string, watchers, conns, attempts, batch int, pace, dur time.Duration) (WatchResult, []*stubbornv1.RunEvent, error) {
	res := WatchResult{Store: store, Mode: mode, Batch: batch, Watchers: watchers, Conns: conns}
	s, err := startStubborn(w, store, conns)
	if err != nil {
		return res, nil, err
	}
	defer s.stop()
	clients := make([]stubbornv1.ControlServiceClient, len(s.conns))
	for i, c := range s.conns {
		clients[i] = stubbornv1.NewControlServiceClient(c)
	}
	r := retryRun(watchedName, int32(attempts-1), pace, pace)
	req := &stubbornv1.StartRunRequest{TaskBrief: r.TaskBrief, Retry: r.Retry}
	if err := measureWatch(ctx, w, s.client, clients, req, batch, dur, &res); err != nil {
		return res, nil, err
	}
	events, err := captureWatched(ctx, w, s, req)
	return res, events, err
}

// runFloor is scenario 6 against the floor (floor.go): a server that
// streams events, and nothing else, emitting those of a run captured from
// Stubborn gap apart.
func runFloor(ctx context.Context, w *world, mode string, watchers, conns, batch int, events []*stubbornv1.RunEvent, gap, dur time.Duration) (WatchResult, error) {
	res := WatchResult{Store: "floor", Mode: mode, Batch: batch, Watchers: watchers, Conns: conns}
	starter, clients, err := w.startFloor(events, gap, conns)
	if err != nil {
		return res, err
	}
	return res, measureWatch(ctx, w, starter, clients, &stubbornv1.StartRunRequest{}, batch, dur, &res)
}

// measureWatch runs one warm-up round, then rounds until dur has passed
// (at least one), into res.
func measureWatch(ctx context.Context, w *world, starter stubbornv1.ControlServiceClient, clients []stubbornv1.ControlServiceClient, req *stubbornv1.StartRunRequest, batch int, dur time.Duration, res *WatchResult) error {
	watchers := res.Watchers
	// One round unmeasured: the connections' flow-control windows start
	// small and grow with use.
	if _, _, _, _, err := watchRound(ctx, w, starter, clients, req, watchers, batch); err != nil {
		return fmt.Errorf("warm-up round: %w", err)
	}
	var all []time.Duration
	var emits []time.Duration
	start := time.Now()
	for res.Rounds == 0 || time.Since(start) < dur {
		lat, events, msgs, emit, err := watchRound(ctx, w, starter, clients, req, watchers, batch)
		if err != nil {
			return fmt.Errorf("round %d: %w", res.Rounds+1, err)
		}
		res.Messages += msgs
		all = append(all, lat...)
		emits = append(emits, emit)
		res.EventsPerWatcher = events
		res.Rounds++
	}
	slices.Sort(all)
	slices.Sort(emits)
	res.Samples = len(all)
	res.P50ms = ms(percentile(all, 0.50))
	res.P99ms = ms(percentile(all, 0.99))
	res.MaxMs = ms(percentile(all, 1))
	res.EmitMs = ms(percentile(emits, 0.5))
	return nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func watchRound(ctx context.Context, w *world, starter stubbornv1.ControlServiceClient, clients []stubbornv1.ControlServiceClient, req *stubbornv1.StartRunRequest, watchers, batch int) (lat []time.Duration, events, messages int, emit time.Duration, err error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	gate := make(chan struct{})
	w.watched.gate.Store(&gate)
	opened := false
	defer func() {
		if !opened {
			close(gate)
		}
	}()
	started, err := starter.StartRun(ctx, req)
	if err != nil {
		return nil, 0, 0, 0, err
	}
	id := started.GetRunId()

	type watcher struct {
		lat         []time.Duration
		first, last time.Time // event times of the first and last live events
		messages    int       // responses with live events
		err         error
	}
	ws := make([]watcher, watchers)
	var ready sync.WaitGroup
	ready.Add(watchers)
	var failed atomic.Bool
	var wg sync.WaitGroup
	for i := range ws {
		wt := &ws[i]
		wt.lat = make([]time.Duration, 0, 128)
		wg.Go(func() {
			isReady := false
			defer func() {
				if !isReady {
					failed.Store(true)
					ready.Done()
				}
			}()
			s, err := clients[i%len(clients)].WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: id, MaxBatch: int32(batch)})
			if err != nil {
				wt.err = err
				return
			}
			var seq int64
			for {
				m, err := s.Recv()
				now := time.Now()
				if errors.Is(err, io.EOF) {
					if wt.last.IsZero() {
						wt.err = fmt.Errorf("stream ended after seq %d", seq)
					}
					return
				}
				if err != nil {
					wt.err = err
					return
				}
				evs := m.GetEvents()
				if batch <= 1 {
					evs = []*stubbornv1.RunEvent{m.GetEvent()}
				}
				live := false
				for _, ev := range evs {
					if ev.GetSeq() != seq+1 {
						wt.err = fmt.Errorf("got seq %d after %d", ev.GetSeq(), seq)
						return
					}
					seq = ev.GetSeq()
					if seq <= gateSeq {
						if seq == gateSeq {
							isReady = true
							ready.Done()
						}
						continue
					}
					live = true
					t := ev.GetTime().AsTime()
					if wt.first.IsZero() {
						wt.first = t
					}
					wt.last = t
					wt.lat = append(wt.lat, now.Sub(t))
				}
				if live {
					wt.messages++
				}
			}
		})
	}
	ready.Wait()
	if failed.Load() {
		cancel()
	}
	close(gate)
	opened = true
	wg.Wait()
	for _, wt := range ws {
		if wt.err != nil {
			return nil, 0, 0, 0, wt.err
		}
		lat = append(lat, wt.lat...)
		events = len(wt.lat)
		messages += wt.messages
		emit = wt.last.Sub(wt.first)
	}
	return lat, events, messages, emit, nil
}
