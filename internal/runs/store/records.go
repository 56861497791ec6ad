package store

import (
	"cmp"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
)

// ErrUnreadable: a run's stored records cannot be decoded.
var ErrUnreadable = errors.New("the run's stored records cannot be read")

// UnreadableRun is ErrUnreadable for run id, with why.
func UnreadableRun(id string, err error) error {
	return fmt.Errorf("%w: run %s: %v (it is left out of listings; DeleteRun removes it)", ErrUnreadable, id, err)
}

// ReadState decodes run id's stored state; its error is ErrUnreadable.
func ReadState(id string, data []byte) (*stubbornv1.ControlState, error) {
	st, err := DecodeState(data)
	if err != nil {
		return nil, UnreadableRun(id, err)
	}
	return st, nil
}

// HasRunFinished reports whether an event's encoding holds run_finished;
// ok is false when it is not a message's encoding.
func HasRunFinished(ev []byte) (finished, ok bool) {
	err := eachField(ev, func(num protowire.Number, typ protowire.Type, _ []byte) {
		if num == runFinishedField && typ == protowire.BytesType {
			finished = true
		}
	})
	if err != nil {
		return false, false
	}
	return finished, true
}

// eachField calls fn with the number, the wire type and the encoding (tag
// and value) of each top-level field of a message's encoding, in order;
// it fails, having called fn for the fields before, when data is not a
// message's encoding.
func eachField(data []byte, fn func(num protowire.Number, typ protowire.Type, field []byte)) error {
	for b := data; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return protowire.ParseError(m)
		}
		fn(num, typ, b[:n+m])
		b = b[n+m:]
	}
	return nil
}

// StateDecodes counts the states decoded whole (DecodeState), for tests
// of what a listing costs.
var StateDecodes atomic.Int64

func DecodeState(data []byte) (*stubbornv1.ControlState, error) {
	StateDecodes.Add(1)
	st := &stubbornv1.ControlState{}
	if err := proto.Unmarshal(data, st); err != nil {
		return nil, fmt.Errorf("undecodable run state: %w", err)
	}
	return st, nil
}

// summaryFields marks the fields of a ControlState that its Summary and
// its tenant are read from: DecodeSummary decodes those alone.
var summaryFields = func() (f [32]bool) {
	fields := (&stubbornv1.ControlState{}).ProtoReflect().Descriptor().Fields()
	for _, name := range []string{"run_id", "status", "winner", "attempts", "task_brief", "control", "create_time", "update_time", "tenant", "cost"} {
		fd := fields.ByName(protoreflect.Name(name))
		if fd == nil || int(fd.Number()) >= len(f) {
			panic("store: ControlState has no field " + name + " below 32")
		}
		f[fd.Number()] = true
	}
	return f
}()

// DecodeSummary decodes the summary and the tenant of a run's encoded
// state, as Summary(DecodeState(data)) and its tenant, decoding only the
// fields they are read from: the run's result, attempts, failure history,
// options and conversation are skipped, not decoded (the listing index
// writes a summary for each run's end).
func DecodeSummary(data []byte) (sum *stubbornv1.RunSummary, tenant string, err error) {
	// The fields kept are copied out whole, into a buffer of their size.
	size := 0
	if err := eachSummaryField(data, func(f []byte) { size += len(f) }); err != nil {
		return nil, "", err
	}
	kept := make([]byte, 0, size)
	_ = eachSummaryField(data, func(f []byte) { kept = append(kept, f...) })
	st := &stubbornv1.ControlState{}
	if err := proto.Unmarshal(kept, st); err != nil {
		return nil, "", fmt.Errorf("undecodable run state: %w", err)
	}
	return Summary(st), st.GetTenant(), nil
}

// eachSummaryField calls fn with the encoding (tag and value) of each
// field of an encoded ControlState that summaryFields marks, in order.
func eachSummaryField(data []byte, fn func([]byte)) error {
	err := eachField(data, func(num protowire.Number, _ protowire.Type, field []byte) {
		if int(num) < len(summaryFields) && summaryFields[num] {
			fn(field)
		}
	})
	if err != nil {
		return fmt.Errorf("undecodable run state: %w", err)
	}
	return nil
}

func IsTerminal(s stubbornv1.RunStatus) bool {
	switch s {
	case stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, stubbornv1.RunStatus_RUN_STATUS_EXHAUSTED,
		stubbornv1.RunStatus_RUN_STATUS_FAILED, stubbornv1.RunStatus_RUN_STATUS_CANCELLED:
		return true
	}
	return false
}

// ListKey orders runs for ListRuns: by creation time, then id.
type ListKey struct {
	Nanos int64
	ID    string
}

func KeyOf(st *stubbornv1.ControlState) ListKey {
	return ListKey{st.GetCreateTime().AsTime().UnixNano(), st.GetRunId()}
}

func (k ListKey) Compare(o ListKey) int {
	if c := cmp.Compare(k.Nanos, o.Nanos); c != 0 {
		return c
	}
	return strings.Compare(k.ID, o.ID)
}

// Before reports whether o comes after k in newest-first order.
func (k ListKey) Before(o ListKey) bool { return o.Compare(k) < 0 }

func (k ListKey) String() string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(k.Nanos, 10) + "/" + k.ID))
}

func ParseListKey(s string) (ListKey, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return ListKey{}, err
	}
	nanos, id, ok := strings.Cut(string(b), "/")
	if !ok || id == "" {
		return ListKey{}, errors.New("no run id in the key")
	}
	n, err := strconv.ParseInt(nanos, 10, 64)
	return ListKey{n, id}, err
}

// Summary is what a list of runs shows of st.
func Summary(st *stubbornv1.ControlState) *stubbornv1.RunSummary {
	return &stubbornv1.RunSummary{
		RunId:      st.GetRunId(),
		Control:    controls.ControlName(st.GetControl()),
		Delegates:  controls.Named(st.GetControl()),
		Status:     st.GetStatus(),
		Attempts:   st.GetAttempts(),
		CreateTime: st.GetCreateTime(),
		UpdateTime: st.GetUpdateTime(),
		Winner:     st.GetWinner(),
		Brief:      briefStart(st.GetTaskBrief()),
		Cost:       st.GetCost().GetTotal(),
	}
}

// summaryBriefChars is how many characters of a run's brief its summary
// keeps (RunSummary.brief).
const summaryBriefChars = 80

// briefStart is RunSummary.brief of a run whose task brief is brief: its
// first summaryBriefChars characters, "…" appended when it is longer.
func briefStart(brief string) string {
	if start := controls.FirstChars(brief, summaryBriefChars); len(start) < len(brief) {
		return start + "…"
	}
	return brief
}

// DefaultKeyWindow is how long a key names its run when Config says
// nothing: a day, as Stripe's idempotency keys.
const DefaultKeyWindow = 24 * time.Hour

// KeyEntry is what the store keeps of an idempotency key.
type KeyEntry struct {
	// RunID is the run the key names.
	RunID string `json:"run_id"`
	// Request is the hash of the request that started it.
	Request string `json:"request"`
	// At is when the entry was written.
	At time.Time `json:"at"`
	// Rev is the entry's revision in the store (compare-and-set).
	Rev uint64 `json:"-"`
}

// ErrStoreFull: Manager.Start refuses a new run because the store has no
// room for it (JetStreamConfig.MaxBytes). Runs in flight go on.
var ErrStoreFull = errors.New("the run store is full")

// ErrNotServing is a store's Send error when no server serves the commands
// of the run's driver: it stopped, and its runs are about to be taken over.
var ErrNotServing = errors.New("no server serves the commands of the run's driver")

// DefaultLease is how long a server that stops beating keeps its runs
// before other servers take them over.
const DefaultLease = 10 * time.Second

// ErrNoIndex: the store keeps no index of the runs' summaries.
var ErrNoIndex = errors.New("the run store keeps no index of runs")

// ErrNotFound: no run has that id.
var ErrNotFound = errors.New("run not found")

// StatusField reads the RunStatus in field num of an encoded message:
// UNSPECIFIED when it has none or does not parse.
func StatusField(b []byte, num protowire.Number) stubbornv1.RunStatus {
	status := stubbornv1.RunStatus_RUN_STATUS_UNSPECIFIED
	for len(b) > 0 {
		n, typ, k := protowire.ConsumeTag(b)
		if k < 0 {
			return stubbornv1.RunStatus_RUN_STATUS_UNSPECIFIED
		}
		b = b[k:]
		if n == num && typ == protowire.VarintType {
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return stubbornv1.RunStatus_RUN_STATUS_UNSPECIFIED
			}
			status = stubbornv1.RunStatus(v)
		}
		m := protowire.ConsumeFieldValue(n, typ, b)
		if m < 0 {
			return stubbornv1.RunStatus_RUN_STATUS_UNSPECIFIED
		}
		b = b[m:]
	}
	return status
}
