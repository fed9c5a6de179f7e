// A stand-in for the Compass module in the images tool's tests: the same
// module path and the same link-time variables as internal/lib/buildinfo, so a binary
// built from it is stamped as .ci/images stamps the real ones, in a second
// rather than the minutes the real daemons take from a cold cache.
module github.com/compass-runner/identity

go 1.26.0
