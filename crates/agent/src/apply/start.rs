//! Starting an operation: the request checked and planned, the single slot claimed, the
//! operation registered for its watchers; then run on an operation thread
//! ([`super::workers`]). A caller of the API has it planned on the operation thread
//! that then runs it ([`Agent::apply_from_caller_then`]): one thread woken per `Apply`
//! (it was a blocking-pool thread, which handed the operation to an operation thread).

use std::sync::Arc;

use super::machine::Op;
use super::{Agent, AgentError, Request, now, refuse_uncovered, try_window, workers};
use crate::plan::Plan;
use inplace_wire::pb;

/// What [`Agent::start`] gave: the answer at once (a dry run, the existing operation of
/// that id), or the new operation's first state and the operation to run.
pub(super) enum Started {
    /// The answer.
    Answer(pb::Operation),
    /// The first state, and the operation to run.
    Run(pb::Operation, Box<dyn FnOnce() + Send + 'static>),
}

impl Agent {
    /// [`Agent::apply`] for a caller of the API, on an operation thread: the request is
    /// checked and planned on the thread that then runs the operation, and `reply` gets
    /// the answer (the first state, or the refusal) before it runs. The server planned on
    /// a blocking-pool thread, which handed the operation to an operation thread: each
    /// hand-over wakes a thread (a context switch on each side).
    ///
    /// An operation id of the form the agent gives the revert of a timed try
    /// ([`try_window::revert_id`]) is refused (INVALID_ARGUMENT naming `operation_id`),
    /// so a caller can neither take a try's revert id before the try ends (its revert
    /// would answer with that operation) nor run an operation under it while the try
    /// waits.
    pub(crate) fn apply_from_caller_then(
        self: &Arc<Self>,
        req: pb::ApplyRequest,
        reply: impl FnOnce(Result<pb::Operation, AgentError>) + Send + 'static,
    ) -> Result<(), AgentError> {
        try_window::check_not_revert_id(&req.operation_id).map_err(AgentError::InvalidRequest)?;
        let agent = Arc::clone(self);
        workers::OPERATIONS
            .run("operation", move || match agent.start(req, Vec::new()) {
                Ok(Started::Run(first, run)) => {
                    reply(Ok(first));
                    run();
                }
                Ok(Started::Answer(op)) => reply(Ok(op)),
                Err(e) => reply(Err(e)),
            })
            .map_err(|e| AgentError::Internal(format!("spawn operation thread: {e}")))
    }

    /// [`Agent::apply`], leaving the node.d files `leave` as they are
    /// ([`Options::leave_files`]): [`Agent::start`], then the operation on a thread of
    /// its own ([`workers`]).
    pub(super) fn apply_leaving(
        self: &Arc<Self>,
        req: pb::ApplyRequest,
        leave: Vec<String>,
    ) -> Result<pb::Operation, AgentError> {
        match self.start(req, leave)? {
            Started::Answer(op) => Ok(op),
            Started::Run(first, run) => {
                // on a reused thread (workers.rs); the operation's id is in every log line
                workers::OPERATIONS.run("operation", run).map_err(|e| {
                    self.release(
                        &first.id,
                        AgentError::Internal(format!("spawn operation thread: {e}")),
                    )
                })?;
                Ok(first)
            }
        }
    }

    /// Frees the operation slot that `id` claimed and is not going to run in; returns `e`.
    fn release(&self, id: &str, e: AgentError) -> AgentError {
        let mut inner = self.lock();
        inner.running = None;
        inner.live.remove(id);
        drop(inner);
        self.planned.notify_all();
        e
    }

    /// Parses the request, answers a dry run, claims the single operation slot, plans
    /// (refusing what is not covered) and registers the operation for its watchers: its
    /// first state and the operation to run, which the caller runs on a thread of its
    /// own (the slot is claimed: it must run, or the slot be released).
    pub(super) fn start(
        self: &Arc<Self>,
        req: pb::ApplyRequest,
        leave: Vec<String>,
    ) -> Result<Started, AgentError> {
        let r = self.request(req, leave)?;
        if r.dry_run {
            return self.dry_run(r).map(Started::Answer);
        }
        self.check_available()?;
        self.check_no_try_waits(&r.id)?;
        // claim the single operation slot, then plan without holding the lock
        if let Some(existing) = self.claim(&r)? {
            return Ok(Started::Answer(existing));
        }
        let release = |e: AgentError| self.release(&r.id, e);
        let plan = self.plan_for(&r.spec, r.opts.clone()).map_err(release)?;
        if let Some(why) = self.lost_record_refusal(&r.spec) {
            return Err(release(AgentError::Precondition(why)));
        }
        refuse_uncovered(&plan).map_err(release)?;
        if r.try_seconds > 0 {
            self.prepare_try(&r.id, &plan).map_err(release)?;
        }
        // operations waiting for a reboot are superseded at this one's commit point
        // (engine.rs, `verifying`), not here: until then their staged changes stand
        let op = self.new_op(&r, &plan);
        // one journal line per change, so `journalctl OPERATION=<id> ITEM=<change id>`
        // finds it (before/after are summaries: a hash for file content, never content)
        for c in &op.wire().changes {
            tracing::info!(operation = %op.id(), item = %c.id, before = %c.before, after = %c.after, "change");
        }
        self.register(op.wire());
        let agent = Arc::clone(self);
        let first = op.wire().clone();
        let Request {
            spec,
            spec_pb,
            opts,
            ..
        } = r;
        Ok(Started::Run(
            first,
            Box::new(move || agent.run(op, spec, spec_pb, plan, opts)),
        ))
    }

    /// The operation of request `r` planned as `plan`, in its first state.
    fn new_op(&self, r: &Request, plan: &Plan) -> Op {
        let t = now();
        Op::new(pb::Operation {
            diffs: Vec::new(),
            id: r.id.clone(),
            message: format!("{} change(s) to apply", plan.report.changes.len()),
            spec_hash: r.hash.clone(),
            reboot_policy: r.policy as i32,
            created: Some(t),
            updated: Some(t),
            changes: plan.report.changes.clone(),
            actions: vec![],
            boot_id: self.boot_id(),
            dry_run: false,
            reboot_method: r.method as i32,
            try_seconds: r.try_seconds,
            try_deadline: (r.try_seconds > 0).then(|| pbjson_types::Timestamp {
                seconds: t.seconds + i64::from(r.try_seconds),
                nanos: t.nanos,
            }),
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::channel;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::apply::{AgentParts, PLANNING_WAIT};
    use inplace_node::system::Recorder;

    /// An agent on an empty node (only `/etc`), its state beside it.
    fn agent() -> (tempfile::TempDir, Arc<Agent>) {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("root/etc")).unwrap();
        let rec = Arc::new(Recorder::default());
        let agent = Agent::new(AgentParts {
            root: d.path().join("root"),
            state_dir: d.path().join("state"),
            config: crate::config::Config::parse("", "test").unwrap(),
            services: rec.clone(),
            rebooter: rec.clone(),
            runner: rec,
            default_healthz: None,
        })
        .unwrap();
        (d, agent)
    }

    fn request(id: &str, path: &str) -> pb::ApplyRequest {
        pb::ApplyRequest {
            desired: Some(pb::NodeSpec {
                files: vec![pb::File {
                    path: path.into(),
                    content: b"x\n".to_vec(),
                    mode: Some(0o644),
                    // whoever runs the test (unprivileged in CI)
                    owner: rustix::process::geteuid().as_raw().to_string(),
                    group: rustix::process::getegid().as_raw().to_string(),
                }],
                ..Default::default()
            }),
            operation_id: id.into(),
            ..Default::default()
        }
    }

    /// `apply_from_caller_then` and the thread its answer came from.
    fn apply(
        agent: &Arc<Agent>,
        req: pb::ApplyRequest,
    ) -> (Result<pb::Operation, AgentError>, String) {
        let (tx, rx) = channel();
        agent
            .apply_from_caller_then(req, move |r| {
                let name = std::thread::current().name().unwrap_or("").to_string();
                tx.send((r, name)).unwrap();
            })
            .unwrap();
        rx.recv_timeout(Duration::from_secs(30)).unwrap()
    }

    fn settled(agent: &Agent, id: &str) -> pb::Operation {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let op = agent.get_operation(id).unwrap();
            if inplace_wire::phase::is_settled(op.phase) && !agent.is_busy() {
                return op;
            }
            assert!(Instant::now() < deadline, "{id} did not settle: {op:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The server's apply is answered from an operation thread (planned there, not on a
    /// blocking-pool thread), before the operation it starts runs to its end there; a
    /// refusal is answered from it too and leaves the slot free; a try's revert id is
    /// refused before any thread is asked.
    #[test]
    fn an_apply_is_planned_and_answered_on_an_operation_thread() {
        let (d, agent) = agent();
        let (first, thread) = apply(&agent, request("one", "/etc/unit/x.conf"));
        assert_eq!(thread, "operation");
        let first = first.unwrap();
        assert_eq!(first.id, "one");
        assert!(!inplace_wire::phase::is_settled(first.phase), "{first:?}");
        assert_eq!(settled(&agent, "one").phase, pb::Phase::Succeeded as i32);
        assert_eq!(
            std::fs::read(d.path().join("root/etc/unit/x.conf")).unwrap(),
            b"x\n"
        );
        // a spec that does not parse: refused from the operation thread, nothing claimed
        let (refused, thread) = apply(&agent, request("two", "etc/relative"));
        assert_eq!(thread, "operation");
        assert!(
            matches!(refused, Err(AgentError::InvalidSpec(_))),
            "{refused:?}"
        );
        assert!(!agent.is_busy());
        let (next, _) = apply(&agent, request("three", "/etc/unit/y.conf"));
        assert_eq!(next.unwrap().id, "three");
        assert_eq!(settled(&agent, "three").phase, pb::Phase::Succeeded as i32);
        let revert = try_window::revert_id("one");
        let e = agent
            .apply_from_caller_then(request(&revert, "/etc/unit/z.conf"), |_| {
                panic!("answered a try's revert id")
            })
            .unwrap_err();
        assert!(matches!(e, AgentError::InvalidRequest(_)), "{e:?}");
    }

    /// A call with the id a concurrent call is still planning waits for that planning's
    /// outcome: the accepted operation once it is registered, or the slot for itself once
    /// the planning was refused and the slot released. Never the operation before it
    /// exists (the breaker's ghost), and not after [`PLANNING_WAIT`] either: the waiter is
    /// woken, so it answers long before that.
    #[test]
    fn a_call_with_an_id_being_planned_waits_for_its_outcome() {
        let (_d, agent) = agent();
        let r = agent
            .request(request("w", "/etc/w.conf"), Vec::new())
            .unwrap();
        assert!(agent.claim(&r).unwrap().is_none(), "the first call plans");
        let waiter = |agent: &Arc<Agent>| {
            let (agent, r) = (
                Arc::clone(agent),
                agent
                    .request(request("w", "/etc/w.conf"), Vec::new())
                    .unwrap(),
            );
            let (tx, rx) = channel();
            std::thread::spawn(move || tx.send(agent.claim(&r)).unwrap());
            rx
        };
        // accepted: the waiter answers with the registered operation
        let rx = waiter(&agent);
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            rx.try_recv().is_err(),
            "it waits while the first call plans"
        );
        assert!(matches!(
            agent.get_operation("w"),
            Err(AgentError::NotFound(_))
        ));
        let op = pb::Operation {
            id: "w".into(),
            spec_hash: r.hash.clone(),
            ..Default::default()
        };
        agent.register(&op);
        let got = rx.recv_timeout(PLANNING_WAIT / 4).unwrap().unwrap();
        assert_eq!(got.map(|o| o.id), Some("w".to_string()));
        // refused: the waiter claims the slot for itself
        agent.lock().live.remove("w");
        let rx = waiter(&agent);
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            rx.try_recv().is_err(),
            "it waits while the first call plans"
        );
        let _ = agent.release("w", AgentError::NotCovered("x".into()));
        let got = rx.recv_timeout(PLANNING_WAIT / 4).unwrap().unwrap();
        assert!(got.is_none(), "the slot is the waiter's to plan in");
        assert!(agent.is_busy());
    }
}
