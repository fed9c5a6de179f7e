package store

// WithMigrationsUpTo stops migrations after version n: a database as an
// older release left it.
func WithMigrationsUpTo(n int) Option {
	return func(o *options) { o.migrateUpTo = n }
}
