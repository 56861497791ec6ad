package telemetry

// The names below are unexported; the package's external tests use them.
const (
	AttemptNumberKey    = attemptNumberKey
	AttemptOutcomeKey   = attemptOutcomeKey
	AttemptTransientKey = attemptTransientKey
	BackoffFromHintKey  = backoffFromHintKey
	ControlKey          = controlKey
	DelegateKey         = delegateKey
	ReasonExhausted     = reasonExhausted
	ReasonKey           = reasonKey
	ReasonNotIdempotent = reasonNotIdempotent
	ReasonNotTransient  = reasonNotTransient
	RunAttemptsKey      = runAttemptsKey
	RunIDKey            = runIDKey
	RunStatusKey        = runStatusKey
	RunWinnerKey        = runWinnerKey
	TenantKey           = tenantKey
)
