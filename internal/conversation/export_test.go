package conversation

// The names below are unexported; the package's external tests use them.
var (
	For = codecFor
)

type (
	ResponsesStreamEncoder = responsesStreamEncoder
)
