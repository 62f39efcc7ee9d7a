//! Coverage answers kept while the node stays the same (issue 28): the extension asks
//! `GetCoverage` for the same spec on every reconcile of a Machine, and an unchanged node
//! was read, parsed and planned in full each time (about 900 µs of the daemon's CPU for
//! `examples/specs/full.yaml`, where an empty call costs 20 µs).
//!
//! An answer is computed under a [`trace`] of every read of the node and of the state
//! directory; its [`Seal`] keeps one look per path read (an `lstat` for most), and a later
//! call for the same request is answered from here when every look sees the same again
//! ([`inplace_node::sysroot::trace`] says what a look covers and what it does not). The
//! planner is a pure function of what those reads return and of the request, so the kept
//! answer is the one a fresh computation would give. A computation that ran a command
//! (`kubelet --version`), asked the network (a release's checksums) or read a file
//! changed a moment ago is not kept.
//!
//! Bounded: [`SLOTS`] answers, none over [`MAX_REPORT_BYTES`] encoded nor for a spec
//! over [`MAX_SPEC_BYTES`], the least recently used out first.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Condvar, Mutex};

use inplace_node::sysroot::trace::{self, Seal};
use inplace_node::sysroot::{Stamp, Sysroot};
use inplace_node::system::{CommandRunner, SystemError};
use inplace_wire::pb;
use prost::Message;
use sha2::{Digest, Sha256};

/// Most answers kept (a few specs asked in turn, e.g. by several callers).
pub(crate) const SLOTS: usize = 4;
/// Largest answer kept, encoded (256 KiB: the daemon's idle RSS target is 12 MiB).
pub(crate) const MAX_REPORT_BYTES: usize = 256 << 10;

/// Largest spec whose answer is kept, encoded (1 MiB): the key is a hash of the encoded
/// spec, and a larger one (up to `policy.max_spec_bytes`, 64 MiB) would be encoded once
/// more per call only to be hashed, where four such calls at once are bounded by the
/// unit's `MemoryMax` (tests/memory_bounds.rs).
pub(crate) const MAX_SPEC_BYTES: usize = 1 << 20;

/// What a request is kept under: SHA-256 of the spec, the reboot policy and the diff
/// options, encoded.
pub(crate) type Key = [u8; 32];

/// The key of a `GetCoverage` request; None (never kept) for a spec over
/// [`MAX_SPEC_BYTES`] encoded.
pub(crate) fn key(
    desired: &pb::NodeSpec,
    policy: pb::RebootPolicy,
    diff: Option<&pb::DiffOptions>,
) -> Option<Key> {
    if desired.encoded_len() > MAX_SPEC_BYTES {
        return None;
    }
    let mut h = Sha256::new();
    h.update(desired.encode_to_vec());
    h.update((policy as i32).to_le_bytes());
    match diff {
        None => h.update([0]),
        Some(d) => {
            h.update([1]);
            h.update(d.encode_to_vec());
        }
    }
    Some(h.finalize().into())
}

struct Kept {
    key: Key,
    seal: Seal,
    report: pb::CoverageReport,
}

/// The kept answers ([`SLOTS`] at most, most recently used last).
#[derive(Default)]
pub(crate) struct KeptCoverage {
    slots: Mutex<Vec<Arc<Kept>>>,
    /// The keys being computed now, and the condition their end is announced on: a
    /// request whose key is being computed waits for that computation and takes its
    /// answer when it was kept and its seal holds ([`KeptCoverage::compute`]).
    computing: Mutex<Vec<Key>>,
    computed: Condvar,
    /// Requests waiting for another computation of their key now.
    waiting: std::sync::atomic::AtomicUsize,
    /// Nothing is kept (`INPLACED_KEEP_COVERAGE=0`: a diagnostic switch, and the
    /// benchmark's floor of a computed answer).
    off: bool,
}

impl std::fmt::Debug for KeptCoverage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeptCoverage")
            .field("answers", &self.lock().len())
            .field("waiting", &self.waiting.load(Relaxed))
            .finish()
    }
}

impl KeptCoverage {
    /// Kept answers, unless the environment says `INPLACED_KEEP_COVERAGE=0`.
    pub(crate) fn from_env() -> KeptCoverage {
        KeptCoverage {
            off: std::env::var_os("INPLACED_KEEP_COVERAGE").is_some_and(|v| v == "0"),
            ..KeptCoverage::default()
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Kept>>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The answer kept under `key` when its seal still holds over `roots`; an answer whose
    /// seal broke is dropped.
    pub(crate) fn get(&self, key: &Key, roots: &[&Sysroot]) -> Option<pb::CoverageReport> {
        if self.off {
            return None;
        }
        let kept = {
            let mut s = self.lock();
            let i = s.iter().position(|k| k.key == *key)?;
            let k = s.remove(i);
            s.push(k.clone());
            k
        };
        if kept.seal.holds(roots) {
            return Some(kept.report.clone());
        }
        self.lock().retain(|k| !Arc::ptr_eq(k, &kept));
        None
    }

    /// Computes `compute()` under a trace and keeps its answer when the trace seals over
    /// `roots` (see the module docs); errors are never kept.
    ///
    /// One computation per key at a time: a request that finds its key being computed
    /// waits for that computation's end (at most [`JOIN_WAIT`]), then takes the answer
    /// it kept if its seal still holds, as [`KeptCoverage::get`] would; otherwise (the
    /// answer was not kept, or the node changed since) it computes its own, without
    /// waiting again. The answer taken is checked against the node as it is after the
    /// request arrived, never one read before it. Identical requests arrive together when
    /// callers retry a slow answer (a client deadline) or several controllers ask for the
    /// same spec: each computation held the node's record, observation and plan at once
    /// (the daemon's peak heap with 8 coverage clients, BENCHMARKS.md).
    pub(crate) fn compute<E>(
        &self,
        key: Key,
        roots: &[&Sysroot],
        compute: impl FnOnce() -> Result<pb::CoverageReport, E>,
    ) -> Result<pb::CoverageReport, E> {
        if self.off {
            return compute();
        }
        let _turn = match self.join(key) {
            Joined::First(turn) => Some(turn),
            Joined::After => match self.get(&key, roots) {
                Some(report) => return Ok(report),
                None => None,
            },
        };
        let (report, t) = trace::record(compute);
        let report = report?;
        let seal = if report.encoded_len() > MAX_REPORT_BYTES {
            Err(format!("the answer is over {MAX_REPORT_BYTES} bytes"))
        } else {
            t.seal(roots)
        };
        if let Err(why) = &seal {
            tracing::debug!(reason = %why, "coverage answer not kept");
        }
        if let Ok(seal) = seal {
            let mut s = self.lock();
            s.retain(|k| k.key != key);
            if s.len() >= SLOTS {
                s.remove(0);
            }
            s.push(Arc::new(Kept {
                key,
                seal,
                report: report.clone(),
            }));
        }
        Ok(report)
    }
}

/// Longest a request waits for another computation of the same key before it computes
/// its own (a computation of the largest spec allowed takes seconds, not minutes).
pub(crate) const JOIN_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// What [`KeptCoverage::join`] found.
enum Joined<'a> {
    /// No computation of the key was running: this request computes, and the turn's
    /// drop announces its end.
    First(Turn<'a>),
    /// Another computation of the key ended (or [`JOIN_WAIT`] passed).
    After,
}

/// A computation of a key in progress; dropped when it ends (an error, a panic too).
struct Turn<'a> {
    kept: &'a KeptCoverage,
    key: Key,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut c = self
            .kept
            .computing
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        c.retain(|k| *k != self.key);
        self.kept.computed.notify_all();
    }
}

impl KeptCoverage {
    /// Takes the turn of `key`, or waits for the computation that has it to end.
    fn join(&self, key: Key) -> Joined<'_> {
        let mut c = self.computing.lock().unwrap_or_else(|p| p.into_inner());
        if !c.contains(&key) {
            c.push(key);
            return Joined::First(Turn { kept: self, key });
        }
        let deadline = std::time::Instant::now() + JOIN_WAIT;
        self.waiting.fetch_add(1, Relaxed);
        while c.contains(&key) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            c = self
                .computed
                .wait_timeout(c, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        self.waiting.fetch_sub(1, Relaxed);
        Joined::After
    }
}

/// Answers of read-only version queries (`kubelet --version`, `kubeadm version -o
/// short`), each kept with the path its program resolves to (symlinks followed) and that
/// file's [`Stamp`], and asked again only when either changes (an upgrade replaces the
/// file, a link is retargeted): a status poll or a coverage call does not start a process
/// every time, and a coverage that found its answers here can be kept. An answer from a
/// program modified in the last 2 s is not kept (a rewrite within the same tick of the
/// coarse clock could leave its stamp equal), nor a failed one, nor one from a program
/// reached by a link whose file name does not begin with the program's (a multi-call
/// program such as `snap`, which answers from files its stamp does not cover), nor one
/// from an interpreted script (`#!`: a wrapper such as `exec /opt/k/current/kubelet
/// "$@"` answers from the program it runs, which a switch of `current` changes while the
/// script stays the same).
#[derive(Debug, Default)]
pub(crate) struct KeptVersions {
    answers: Mutex<HashMap<Vec<String>, Answer>>,
}

/// The last component of a path.
fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The file at `path` begins with `#!` (an interpreter runs it); a file that can not be
/// read counts as one (its answer is not kept).
fn is_script(root: &Sysroot, path: &str) -> bool {
    use std::io::Read;
    let mut head = [0u8; 2];
    match root.open_read(path) {
        Ok(Some(mut f)) => f.read_exact(&mut head).map_or(true, |()| head == *b"#!"),
        _ => true,
    }
}

/// A query's output, with the path its program resolved to and that file's stamp.
type Answer = ((String, Stamp), String);

/// A [`CommandRunner`] whose queries are answered from [`KeptVersions`] when the program
/// is unchanged; everything else goes to `inner`.
#[derive(Debug)]
pub(crate) struct VersionQueries<'a> {
    pub inner: &'a dyn CommandRunner,
    pub root: &'a Sysroot,
    pub kept: &'a KeptVersions,
}

impl CommandRunner for VersionQueries<'_> {
    fn run(&self, argv: &[String]) -> Result<String, SystemError> {
        self.inner.run(argv)
    }

    fn query(&self, argv: &[String]) -> Result<String, SystemError> {
        let program = argv.first().and_then(|p| {
            let real = self.root.resolve(p).ok()?;
            // a multi-call program (`/snap/bin/kubelet -> /usr/bin/snap`, busybox) answers
            // by the name it was run as, from files its stamp does not cover (`snap
            // refresh` retargets `/snap/<name>/current`): asked every time. A versioned
            // name (`kubelet -> /etc/alternatives/kubelet -> kubelet-1.34`) is kept.
            if !file_name(&real).starts_with(file_name(p)) {
                return None;
            }
            // an interpreted script (`#!`) answers from what it runs, which its stamp does
            // not cover (a wrapper's `exec /opt/k/current/kubelet "$@"`, `current`
            // switched): asked every time, like a multi-call program
            if is_script(self.root, &real) {
                return None;
            }
            let stamp = self.root.stamp(&real).ok()??;
            Some((real, stamp))
        });
        let Some(program) = program else {
            return self.inner.query(argv);
        };
        let lock = || self.kept.answers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((s, out)) = lock().get(argv)
            && *s == program
        {
            return Ok(out.clone());
        }
        let out = self.inner.query(argv)?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if !program.1.is_recent(now, 2) {
            lock().insert(argv.to_vec(), (program, out.clone()));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::mpsc;

    fn report(n: u32) -> pb::CoverageReport {
        pb::CoverageReport {
            spec_hash: format!("computation {n}"),
            ..Default::default()
        }
    }

    /// Starts a computation of `key` on another thread that blocks until `release` sends;
    /// returns once it runs.
    fn blocked_first(
        kept: &Arc<KeptCoverage>,
        root: &Arc<Sysroot>,
        key: Key,
        calls: &Arc<AtomicUsize>,
        fail: bool,
    ) -> (
        mpsc::Sender<()>,
        std::thread::JoinHandle<Result<pb::CoverageReport, String>>,
    ) {
        let (started_tx, started) = mpsc::channel();
        let (release, released) = mpsc::channel::<()>();
        let (k, r, c) = (kept.clone(), root.clone(), calls.clone());
        let first = std::thread::spawn(move || {
            k.compute(key, &[&r], || {
                started_tx.send(()).unwrap();
                released.recv().unwrap();
                c.fetch_add(1, Relaxed);
                if fail {
                    Err("failed".to_string())
                } else {
                    Ok(report(1))
                }
            })
        });
        started.recv().unwrap();
        (release, first)
    }

    fn second(
        kept: &Arc<KeptCoverage>,
        root: &Arc<Sysroot>,
        key: Key,
        calls: &Arc<AtomicUsize>,
    ) -> std::thread::JoinHandle<Result<pb::CoverageReport, String>> {
        let (k, r, c) = (kept.clone(), root.clone(), calls.clone());
        let t = std::thread::spawn(move || {
            k.compute(key, &[&r], || {
                c.fetch_add(1, Relaxed);
                Ok(report(2))
            })
        });
        while kept.waiting.load(Relaxed) == 0 {
            std::thread::yield_now();
        }
        t
    }

    #[test]
    fn a_request_whose_key_is_being_computed_takes_that_kept_answer() {
        let dir = tempfile::tempdir().unwrap();
        let root = Arc::new(Sysroot::open(dir.path()).unwrap());
        let (kept, calls) = (
            Arc::new(KeptCoverage::default()),
            Arc::new(AtomicUsize::new(0)),
        );
        let (release, first) = blocked_first(&kept, &root, [7; 32], &calls, false);
        let waiter = second(&kept, &root, [7; 32], &calls);
        // another key is not held up by the computation of the first
        let other = kept.compute([8; 32], &[&root], || Ok::<_, String>(report(3)));
        assert_eq!(other.unwrap().spec_hash, "computation 3");
        release.send(()).unwrap();
        assert_eq!(first.join().unwrap().unwrap().spec_hash, "computation 1");
        assert_eq!(waiter.join().unwrap().unwrap().spec_hash, "computation 1");
        assert_eq!(
            calls.load(Relaxed),
            1,
            "the waiting request computed nothing"
        );
        assert_eq!(kept.waiting.load(Relaxed), 0);
    }

    #[test]
    fn a_waiting_request_computes_its_own_when_the_answer_was_not_kept() {
        let dir = tempfile::tempdir().unwrap();
        let root = Arc::new(Sysroot::open(dir.path()).unwrap());
        let (kept, calls) = (
            Arc::new(KeptCoverage::default()),
            Arc::new(AtomicUsize::new(0)),
        );
        let (release, first) = blocked_first(&kept, &root, [7; 32], &calls, true);
        let waiter = second(&kept, &root, [7; 32], &calls);
        release.send(()).unwrap();
        assert_eq!(first.join().unwrap().unwrap_err(), "failed");
        assert_eq!(waiter.join().unwrap().unwrap().spec_hash, "computation 2");
        assert_eq!(calls.load(Relaxed), 2);
    }
}
