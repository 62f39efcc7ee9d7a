//! Drift: managed items whose node state differs from the applied record, as the
//! sections see it ([`crate::plan::drift`]), with the time each was first seen
//! (`drift.json`). Drift is only reported: the agent never repairs it by itself.

use super::{Agent, now};
use crate::plan;
use crate::state::AppliedRecord;
use inplace_wire::pb;

impl Agent {
    /// Scans for drift now, records new detections (with the time first seen) in
    /// `drift.json`, and returns the drift list and the total count of detections. Drift is
    /// only reported: the agent never repairs it by itself.
    pub(crate) fn scan_drift(&self) -> (Vec<pb::Drift>, u64) {
        match self.state.load_record() {
            Ok(r) => self.scan_drift_with(&r),
            Err(_) => (Vec::new(), 0),
        }
    }

    pub(super) fn scan_drift_with(&self, record: &AppliedRecord) -> (Vec<pb::Drift>, u64) {
        let _guard = self.drift_lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut drift = self.drift(record);
        let mut book = self.state.load_drift();
        let now_s = now().seconds;
        let mut changed = false;
        for d in &drift {
            if !book.seen.contains_key(&d.id) {
                book.seen.insert(d.id.clone(), now_s);
                book.detections += 1;
                changed = true;
                tracing::warn!(item = %d.id, expected = %d.expected, observed = %d.observed, "drift detected");
            }
        }
        let before = book.seen.len();
        book.seen.retain(|id, _| drift.iter().any(|d| &d.id == id));
        changed |= before != book.seen.len();
        if changed {
            let _ = self.state.save_drift(&book);
        }
        for d in &mut drift {
            d.since = book.seen.get(&d.id).map(|s| pbjson_types::Timestamp {
                seconds: *s,
                nanos: 0,
            });
        }
        (drift, book.detections)
    }

    /// Directories holding managed items, for the drift watcher (inotify).
    pub(crate) fn watched_dirs(&self) -> Vec<String> {
        let Ok(r) = self.state.load_record() else {
            return Vec::new();
        };
        let parent = |p: &str| {
            p.rsplit_once('/').map(|(d, _)| {
                if d.is_empty() {
                    "/".to_string()
                } else {
                    d.to_string()
                }
            })
        };
        let paths = plan::watched(&self.root, &self.config, &r);
        let dirs: std::collections::BTreeSet<String> =
            paths.iter().filter_map(|p| parent(p)).collect();
        dirs.into_iter().collect()
    }

    /// Managed items whose observed state differs from the applied record.
    pub(crate) fn drift(&self, record: &AppliedRecord) -> Vec<pb::Drift> {
        plan::drift(&self.root, &self.config, record)
    }
}
