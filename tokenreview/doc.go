// Package tokenreview asks a cluster's API server whether a projected
// ServiceAccount token is still accepted: an authentication.k8s.io/v1
// TokenReview naming the audience the token must carry, as SPIRE's k8s_psat
// attestor does.
//
// Offline verification (package verifier) cannot see that the pod a token is
// bound to is gone: a deleted pod's token verifies until it expires. The API
// server checks the bound objects (the ServiceAccount, the pod, by name and
// UID) on every review and answers "not authenticated" once the pod is
// deleted. Review is that check, for the clusters that opt in.
//
// # Attacker model
//
// Anyone can present any string to a door, and a door that reviews what it is
// given turns each string into a request to the cluster's API server. The
// caller reviews only tokens that passed offline verification (a genuine,
// unexpired token of the cluster's Runner ServiceAccount), so a request costs
// a valid signature. Independently of that: a token longer than MaxTokenBytes
// is refused without a request, concurrent Reviews of one token send one
// request, answers are cached under the token's SHA-256 (MaxCacheEntries of
// them, whatever is presented), and no request outlives RequestTimeout.
//
// The API server is trusted for its answer; the network between is not: the
// Server URL must be https, CAFile (when set) is the whole trust, and
// redirects are not followed (a redirect would carry the reviewed token, in
// the request body, to wherever it points). An answer that is not an
// authentication.k8s.io/v1 TokenReview is unavailable, never a rejection, so
// a proxy's empty 200 cannot get a token cached as refused.
//
// A failure to ask is never a refusal: the network, a timeout, a 5xx, a
// refusal of the reviewer's own credentials (401, 403) and a malformed answer
// are ErrUnavailable, not cached, and the caller decides (a door answers
// Unavailable, which Runners retry). ErrRejected is only ever the API server's
// own answer about the token.
//
// The reviewed token is never logged, never in an error (the API server's
// status.error text is included only when it does not quote the token, capped
// and stripped of control characters), and never a cache key in clear. The
// API server's answer echoes the token in spec.token; the body is read into
// memory, capped at MaxResponseBytes, and only status is decoded.
//
// # The reviewer's credential
//
// Config.TokenFile is a bearer token the reviewer presents to the API server,
// re-read whenever the file changes (a projected token, which the kubelet
// rotates, or a Secret's token). Its identity needs exactly this RBAC and
// nothing more (the built-in system:auth-delegator also grants
// subjectaccessreviews, which the reviewer does not use):
//
//	apiVersion: rbac.authorization.k8s.io/v1
//	kind: ClusterRole
//	metadata:
//	  name: compass-tokenreview
//	rules:
//	  - apiGroups: ["authentication.k8s.io"]
//	    resources: ["tokenreviews"]
//	    verbs: ["create"]
//
// bound by a ClusterRoleBinding to the reviewer's ServiceAccount (or user).
// A stolen reviewer credential lets its holder learn whether tokens it
// already holds are valid, nothing else.
//
// # How long an answer is used
//
// An accepted answer is used for at most MaxAcceptedAge (and never past the
// caller's notAfter), so a deleted pod's token is refused within that bound,
// plus the API server's own cache of successful token authentications (10 s
// in kube-apiserver) and its informers' lag; see MaxAcceptedAge. A rejected
// answer is used until notAfter: a token the API server has refused does not
// become valid again (its pod, its ServiceAccount, its audience do not come
// back with the same UID). One rejection is not final, and is cached all the
// same, since the answer does not tell it apart: kube-apiserver also answers
// "not authenticated" when it cannot read the bound pod (its informer has
// not seen a new pod and the read from etcd fails). The Runner's next token,
// which the kubelet fetches at 80 % of the current one's life, is reviewed
// afresh.
package tokenreview
