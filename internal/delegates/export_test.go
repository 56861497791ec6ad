package delegates

// The names below are unexported; the package's external tests use them.
const (
	DefaultTimeout       = defaultTimeout
	HeaderAttempt        = headerAttempt
	HeaderIdempotencyKey = headerIdempotencyKey
	HeaderRunID          = headerRunID
	PushbackTrailer      = pushbackTrailer
)

var (
	DefaultLimits    = defaultLimits
	EditDistance     = editDistance
	ErrInvalidConfig = errInvalidConfig
	Load             = load
	NewPool          = newPool
)
