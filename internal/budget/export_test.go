package budget

// The backoff's bounds, for the tests in package budget_test.
const (
	ConflictBase     = conflictBase
	ConflictCap      = conflictCap
	ConflictPatience = conflictPatience
)
