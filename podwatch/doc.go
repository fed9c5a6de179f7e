// Package podwatch watches the pods of one namespace of a cluster's API
// server and reports those going away: deleted, or marked for deletion
// (metadata.deletionTimestamp set, which the API server sets the moment a
// pod is deleted with a grace period, before the kubelet stops it).
//
// Issue 34: a Runner's token is reviewed by the API server at both doors
// (package tokenreview), which refuses a deleted pod's token only 10-20 s
// after the deletion, and a Runner's live NATS connection outlives its pod.
// A watch learns of the deletion as the API server commits it: the caller
// keeps the reported pods as a deleted set, consulted by both doors and by
// the callout's kicker, which ends the pod's NATS connection (kick reason
// pod_deleted).
//
// # How it watches
//
// Run lists the namespace's pods (ListPageSize a page, with continue
// tokens) to learn the resourceVersion and to report the pods already
// marked for deletion, then watches from that resourceVersion with
// bookmarks (allowWatchBookmarks) and a server-side timeoutSeconds
// (WatchTimeout), re-watching from the last resourceVersion seen whenever a
// stream ends. A 410 (the resourceVersion too old) lists again; that list
// also reports the pods remembered from before that it no longer holds,
// deleted while the watch was down. With a LabelSelector, a pod relabelled
// out of the selection comes as a DELETED event and is reported too: a
// Runner pod released from its DaemonSet is no Runner any more. Each pod is
// reported once per UID; a
// UID is forgotten when its DELETED event is seen, and at most
// MaxTrackedPods are remembered.
//
// Only a pod's metadata.uid, name, resourceVersion, deletionTimestamp and
// spec.nodeName are decoded; the rest of each event (a Pod can be large: its
// containers, its status) is skipped. An event, or a listed pod, larger than
// MaxEventBytes is malformed.
//
// # A dead stream
//
// A watch has no client-side timeout (it would end a healthy stream). It is
// bounded instead three ways. Until its response headers: RequestTimeout.
// Between events: WatchIdleTimeout, two BookmarkIntervals and a slack
// (kube-apiserver sends a watch that allows bookmarks one a minute when
// nothing else happens), after which the stream is taken for dead, closed,
// logged at ERROR and opened again. In all: the API server's timeoutSeconds.
// Over HTTP/2 (all the requests share one connection) the connection is
// pinged after 30 s of silence and closed if the ping is not answered in
// 15 s, so a dead connection is not reused by the next request.
//
// # Failures
//
// Run never gives up: every failure (the network, a 5xx, a 401 or 403 of
// the watcher's own credential, a malformed answer, a silent stream) is
// logged at ERROR with the server and the namespace and retried with a
// jittered exponential backoff (WithBackoff), and Healthy reports false
// from the failure until a watch is established again. Text the API server
// sends is quoted only capped, stripped of control characters, and withheld
// if it could quote the watcher's token; the token is never logged.
//
// The API server is trusted for what it says; the network between is not:
// the Server URL must be https, CAFile (when set) is the whole trust, and
// redirects are not followed (one would carry the watcher's token).
//
// # The watcher's credential
//
// Config.TokenFile is a bearer token the watcher presents, re-read whenever
// the file changes (a projected token, which the kubelet rotates). Its
// identity needs get, list and watch on pods in the Runner's namespace, and
// nothing else: a Role and a RoleBinding in that namespace, which the
// operator creates (the chart cannot render them: DL-440 fixes that the
// rendered manifests hold no RoleBinding in the Runner's namespace):
//
//	apiVersion: rbac.authorization.k8s.io/v1
//	kind: Role
//	metadata:
//	  name: compass-podwatch
//	  namespace: compass-runner
//	rules:
//	  - apiGroups: [""]
//	    resources: ["pods"]
//	    verbs: ["get", "list", "watch"]
//	---
//	apiVersion: rbac.authorization.k8s.io/v1
//	kind: RoleBinding
//	metadata:
//	  name: compass-podwatch
//	  namespace: compass-runner
//	roleRef:
//	  apiGroup: rbac.authorization.k8s.io
//	  kind: Role
//	  name: compass-podwatch
//	subjects:
//	  - kind: ServiceAccount
//	    name: compass-server # the daemon's ServiceAccount
//	    namespace: compass-system
//
// A stolen watcher credential reads the Runner namespace's pods (their
// specs, not their tokens), nothing more.
package podwatch
