package conversation

import (
	"errors"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// NewStreamDecoder reads a Responses API event stream.
func (Responses) NewStreamDecoder() StreamDecoder { return &responsesStreamDecoder{} }

type responsesStreamDecoder struct{ acc accumulator }

func (d *responsesStreamDecoder) Next(ev Event) ([]*stubbornv1.OutputDelta, bool, error) {
	return nil, false, errors.New("conversation: the Responses API's stream is not decoded yet")
}

func (d *responsesStreamDecoder) Result() *stubbornv1.Result { return d.acc.result() }

// NewStreamEncoder writes a Responses API event stream.
func (Responses) NewStreamEncoder(m Meta) StreamEncoder { return &responsesStreamEncoder{meta: m} }

type responsesStreamEncoder struct{ meta Meta }

func (e *responsesStreamEncoder) Deltas(ds []*stubbornv1.OutputDelta) ([]Event, error) {
	return nil, errors.New("conversation: the Responses API's stream is not encoded yet")
}

func (e *responsesStreamEncoder) End(r *stubbornv1.Result) ([]Event, error) {
	return nil, errors.New("conversation: the Responses API's stream is not encoded yet")
}
