package controls

// The names below are unexported; the package's external tests use them.
const (
	AnalystAdviceChars       = analystAdviceChars
	DefaultMaxRetries        = defaultMaxRetries
	MaxDelegateNameBytes     = maxDelegateNameBytes
	WordingRetryWithLearning = wordingRetryWithLearning
)

var (
	Apply          = apply
	Backoff        = backoff
	BackoffBound   = backoffBound
	ErrInterrupted = errInterrupted
	ErrTooLarge    = errTooLarge
	FallbackChain  = fallbackChain
	JudgeBrief     = judgeBrief
	NewBudget      = newBudget
	Retry          = retryControl
)

type (
	CriteriaError = criteriaError
)
