package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// Scenario 6's floor ("floor" in the store column) is the physical limit of
// WatchRun's fan-out on this machine, as scenario 2b is for Run: a
// ControlService that keeps a run's events, encoded once, in a slice and
// streams them to every watcher as they are appended, with nothing else (no
// runs, no store, no limits, no telemetry). Its runs emit the events of a
// run captured from Stubborn at the pace Stubborn emitted them under the
// same load (the measurement's emit time ÷ its live events), after the same
// gate. The watchers are scenario 6's: same connections, same decoding.

// floorServer serves the floor's runs.
type floorServer struct {
	stubbornv1.UnimplementedControlServiceServer
	events []*stubbornv1.RunEvent // a captured run's, seq 1 on
	gap    time.Duration          // between two live events
	gate   func() <-chan struct{} // the round's gate, like the watched delegate's

	mu   sync.Mutex
	runs map[string]*floorRun
	next atomic.Int64
}

// floorRun is one run's journal: each event as the WatchRunResponse that
// carries it alone, and as the element of WatchRunResponse.events.
type floorRun struct {
	mu      sync.Mutex
	single  [][]byte
	element [][]byte
	done    bool
	changed chan struct{}
}

// StartRun starts a run that emits the captured events: those before the
// gate at once, the others gap apart once it opens.
func (f *floorServer) StartRun(context.Context, *stubbornv1.StartRunRequest) (*stubbornv1.StartRunResponse, error) {
	id := "floor-" + strconv.FormatInt(f.next.Add(1), 10)
	r := &floorRun{changed: make(chan struct{})}
	f.mu.Lock()
	if f.runs == nil {
		f.runs = map[string]*floorRun{}
	}
	f.runs[id] = r
	f.mu.Unlock()
	gate := f.gate()
	go func() {
		for i, ev := range f.events {
			if int64(i) == gateSeq {
				<-gate
			} else if int64(i) > gateSeq {
				time.Sleep(f.gap)
			}
			ev = proto.CloneOf(ev)
			ev.RunId, ev.Time = id, timestamppb.Now()
			r.append(ev, i == len(f.events)-1)
		}
	}()
	return &stubbornv1.StartRunResponse{RunId: id}, nil
}

func (r *floorRun) append(ev *stubbornv1.RunEvent, last bool) {
	data, _ := proto.Marshal(ev)
	single := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), data)
	element := protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), data)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.single = append(r.single, single)
	r.element = append(r.element, element)
	r.done = last
	close(r.changed)
	r.changed = make(chan struct{})
}

// since returns the encodings after the first n, whether the run is done,
// and a channel closed on the next event.
func (r *floorRun) since(n int) (single, element [][]byte, done bool, changed <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.single[n:], r.element[n:], r.done, r.changed
}

// WatchRun streams the run's events after after_seq, max_batch at a time.
func (f *floorServer) WatchRun(req *stubbornv1.WatchRunRequest, stream grpc.ServerStreamingServer[stubbornv1.WatchRunResponse]) error {
	f.mu.Lock()
	r := f.runs[req.GetRunId()]
	f.mu.Unlock()
	if r == nil {
		return errors.New("no such run")
	}
	n := int(req.GetAfterSeq())
	for {
		single, element, done, changed := r.since(n)
		for len(single) > 0 {
			k := 1
			msg := rawMessage(single[0])
			if req.GetMaxBatch() > 1 {
				k = min(len(element), int(req.GetMaxBatch()))
				var b []byte
				for _, e := range element[:k] {
					b = append(b, e...)
				}
				msg = b
			}
			if err := stream.SendMsg(msg); err != nil {
				return err
			}
			n += k
			single, element = single[k:], element[k:]
		}
		if done {
			return nil
		}
		select {
		case <-changed:
		case <-stream.Context().Done():
			return stream.Context().Err()
		}
	}
}

// rawMessage is a response already encoded.
type rawMessage []byte

// rawCodec sends a rawMessage as it is and everything else as gRPC's proto
// codec does.
type rawCodec struct{ proto encoding.CodecV2 }

func (c rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if m, ok := v.(rawMessage); ok {
		return mem.BufferSlice{mem.SliceBuffer(m)}, nil
	}
	return c.proto.Marshal(v)
}

func (c rawCodec) Unmarshal(data mem.BufferSlice, v any) error { return c.proto.Unmarshal(data, v) }

func (c rawCodec) Name() string { return grpcproto.Name }

// startFloor serves a floor of events on loopback and returns its clients,
// one per connection.
func (w *world) startFloor(events []*stubbornv1.RunEvent, gap time.Duration, nconns int) (starter stubbornv1.ControlServiceClient, clients []stubbornv1.ControlServiceClient, err error) {
	lis, err := listen()
	if err != nil {
		return nil, nil, err
	}
	gs := grpc.NewServer(grpc.ForceServerCodecV2(rawCodec{encoding.GetCodecV2(grpcproto.Name)}))
	stubbornv1.RegisterControlServiceServer(gs, &floorServer{events: events, gap: gap, gate: func() <-chan struct{} {
		return *w.watched.gate.Load()
	}})
	go func() { _ = gs.Serve(lis) }()
	w.servers = append(w.servers, gs)
	for range max(nconns, 1) {
		c, err := w.dial(lis.Addr().String())
		if err != nil {
			return nil, nil, err
		}
		clients = append(clients, stubbornv1.NewControlServiceClient(c))
	}
	return clients[0], clients, nil
}

// captureWatched runs the watched run once on s, its gate open, and
// returns its events.
func captureWatched(ctx context.Context, w *world, s *stubborn, req *stubbornv1.StartRunRequest) ([]*stubbornv1.RunEvent, error) {
	gate := make(chan struct{})
	close(gate)
	w.watched.gate.Store(&gate)
	started, err := s.client.StartRun(ctx, req)
	if err != nil {
		return nil, err
	}
	ws, err := s.client.WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: started.GetRunId()})
	if err != nil {
		return nil, err
	}
	var evs []*stubbornv1.RunEvent
	for {
		m, err := ws.Recv()
		if errors.Is(err, io.EOF) {
			if len(evs) <= gateSeq {
				return nil, fmt.Errorf("captured run has %d events", len(evs))
			}
			return evs, nil
		}
		if err != nil {
			return nil, err
		}
		evs = append(evs, m.GetEvent())
	}
}
