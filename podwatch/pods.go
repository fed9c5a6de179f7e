package podwatch

// podState is what is remembered of a pod, by UID.
type podState struct {
	name, node string
	reported   bool   // onGone was called for it
	seen       uint64 // the last list (Watcher.gen) that held it
}

// report calls onGone for p.
func (w *Watcher) report(uid, name, node string) {
	w.onGone(Gone{UID: uid, Name: name, Node: node, At: w.now()})
}

// track remembers p, from a list page or an ADDED or MODIFIED event, and
// reports it if it is marked for deletion and was not reported yet.
func (w *Watcher) track(p pod) {
	st := w.pods[p.uid]
	if st == nil {
		if len(w.pods) < w.maxTracked {
			st = &podState{}
			w.pods[p.uid] = st
		} else if !w.overflow {
			w.overflow = true
			w.log.Error("podwatch: more pods than MaxTrackedPods; pods past it are not remembered: each is reported when it is deleted or marked for deletion, possibly more than once, but not if deleted while the watch is down",
				"server", w.server, "namespace", w.namespace, "max", w.maxTracked)
		}
	}
	if st != nil {
		st.name, st.node, st.seen = p.name, p.node, w.gen
	}
	if p.terminating && (st == nil || !st.reported) {
		if st != nil {
			st.reported = true
		}
		w.report(p.uid, p.name, p.node)
	}
}

// deleted forgets p, from a DELETED event, and reports it unless it was.
func (w *Watcher) deleted(p pod) {
	st := w.pods[p.uid]
	delete(w.pods, p.uid)
	if st == nil || !st.reported {
		w.report(p.uid, p.name, p.node)
	}
}

// listDone ends a list (generation w.gen): a pod remembered from before
// that the list did not hold was deleted while the watch was down, its
// DELETED event never seen. It is reported, unless it was, and forgotten.
func (w *Watcher) listDone() {
	for uid, st := range w.pods {
		if st.seen != w.gen {
			delete(w.pods, uid)
			if !st.reported {
				w.report(uid, st.name, st.node)
			}
		}
	}
}
