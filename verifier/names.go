package verifier

// Name checks on the hot path of Verify. They state the same rules as the
// regular expressions in their comments (names_test.go holds those as the
// oracle) without running a regexp engine on every token (the two matches
// were about 7 µs of Verify's 68 in the connect harness's profile).

// maxNodeName is Kubernetes' bound on a Node name (an RFC 1123 subdomain).
const maxNodeName = 253

// validNodeName reports whether s is an RFC 1123 subdomain of at most 253
// bytes, as Kubernetes accepts for a Node name:
// ^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$
func validNodeName(s string) bool {
	if len(s) == 0 || len(s) > maxNodeName {
		return false
	}
	start := 0 // the current label's first byte
	for i := 0; i <= len(s); i++ {
		if i < len(s) && s[i] != '.' {
			c := s[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
			continue
		}
		// A label ends at i: non-empty, and neither end is '-'.
		if i == start || s[start] == '-' || s[i-1] == '-' {
			return false
		}
		start = i + 1
	}
	return true
}

// maxNodeUID bounds a node UID in a deny list or a token.
const maxNodeUID = 128

// validNodeUID reports whether s looks like a Kubernetes UID, as deny lists
// accept them: ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$. Kubernetes object UIDs
// are UUIDs; this accepts any plausible UID spelling without admitting
// whitespace, control characters or separators that could confuse a log
// reader.
func validNodeUID(s string) bool {
	if len(s) == 0 || len(s) > maxNodeUID {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '.' && c != '_' && c != '-') {
			return false
		}
	}
	return true
}
