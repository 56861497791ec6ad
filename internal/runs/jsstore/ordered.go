package jsstore

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// orderedRead says what eachOrdered reads of a stream.
type orderedRead struct {
	// cfg selects the messages and where the read starts. The ordered
	// consumer recreates itself past a gap in what it was sent (a lost
	// message, a server that restarted): fn never sees one out of order.
	cfg jetstream.OrderedConsumerConfig
	// idle, when positive, makes the read a scan: of the messages up to
	// the last one the stream had when it began (none: it returns at
	// once), each waited for at most idle. A scan that waits idle for the
	// next message ends there: the messages it waited for went meanwhile
	// (another replica purged them, their TTL ran out). Zero makes the
	// read a follow: of what is stored, then of each new message, until
	// ctx ends or fn stops it.
	idle time.Duration
	// whole makes a scan's wait of idle an error, not its end: a read cut
	// short (a stalled consumer) must not pass for the whole one.
	whole bool
}

// eachOrdered calls fn with the messages of stream that r selects, in
// order, each with its metadata, while fn returns true; it returns fn's
// error, or the read's (ctx's once ctx ends).
func eachOrdered(ctx context.Context, stream jetstream.Stream, r orderedRead, fn func(jetstream.Msg, *jetstream.MsgMetadata) (bool, error)) error {
	it, end, err := r.open(ctx, stream)
	if err != nil || it == nil {
		return err
	}
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	for {
		msg, meta, err := r.next(ctx, it)
		if err != nil || msg == nil {
			return err
		}
		more, err := fn(msg, meta)
		if err != nil || !more || end > 0 && (meta.Sequence.Stream >= end || meta.NumPending == 0) {
			return err
		}
	}
}

// open starts r's read of stream: the consumer's messages, and the stream
// sequence a scan ends at (0: a follow). No messages, and no error: a
// scan with nothing to read.
func (r orderedRead) open(ctx context.Context, stream jetstream.Stream) (jetstream.MessagesContext, uint64, error) {
	end := uint64(0)
	if r.idle > 0 {
		info, err := stream.Info(ctx)
		if err != nil || info.State.Msgs == 0 {
			return nil, 0, err
		}
		end = info.State.LastSeq
	}
	cons, err := stream.OrderedConsumer(ctx, r.cfg)
	if err != nil {
		return nil, 0, err
	}
	if end > 0 {
		// Nothing selected (a start past the end): a scan would wait idle
		// for nothing.
		if ci := cons.CachedInfo(); ci == nil || ci.NumPending == 0 {
			return nil, 0, nil
		}
	}
	it, err := cons.Messages()
	if err != nil {
		return nil, 0, err
	}
	return it, end, nil
}

// next is the read's next message, with its metadata; none, and no error,
// when a scan has waited idle for it.
func (r orderedRead) next(ctx context.Context, it jetstream.MessagesContext) (jetstream.Msg, *jetstream.MsgMetadata, error) {
	var opts []jetstream.NextOpt
	if r.idle > 0 {
		opts = append(opts, jetstream.NextMaxWait(r.idle))
	}
	msg, err := it.Next(opts...)
	if r.idle > 0 && !r.whole && errors.Is(err, nats.ErrTimeout) {
		return nil, nil, nil
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		return nil, nil, err
	}
	meta, err := msg.Metadata()
	if err != nil {
		return nil, nil, err
	}
	return msg, meta, nil
}
