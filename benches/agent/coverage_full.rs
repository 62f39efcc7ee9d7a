//! Coverage of `examples/specs/full.yaml` (every section: files with an owner, kubelet
//! config and flags, sysctls, kernel arguments): the daemon CPU per call and the latency,
//! each against an empty call measured in the same run (issue 28). Run alone, on a fresh
//! daemon, with `BENCH_ONLY=coverage` (about 10 s): the quick way to compare two daemon
//! binaries (`INPLACED_BENCH_BIN`) in interleaved runs.
//!
//! The same request on an unchanged node is answered from what the daemon kept
//! (`crates/agent/src/apply/kept.rs`); `BENCH_ONLY=coverage` measures a second daemon
//! started with `INPLACED_KEEP_COVERAGE=0` too (`coverage_full_computed_*`): the cost of
//! an answer computed afresh, as after any change to the node.

use super::*;

/// Blocks of this many calls alternate between the empty call and the coverage call;
/// the daemon's schedstat CPU is summed per kind.
const BLOCK: usize = 50;

/// Pairs of blocks in a whole run: 5000 calls of each kind, so that the p99 is the 50th
/// slowest call (it was the 5th up to session 15, and moved between 1.6x and 5.8x from
/// run to run of one build: BENCHMARKS.md, "How many calls a p99 needs").
pub(crate) const BLOCKS: usize = 100;

/// Measures `blocks` pairs of blocks on the daemon `pid` behind `socket`: latency p50 and
/// p99 of each kind, daemon CPU per call of each kind (µs, schedstat), and the ratios.
/// `what` names the figures (`full`, `full_computed`).
pub(crate) async fn coverage_full(
    rep: &mut Report,
    what: &str,
    socket: &Path,
    pid: u32,
    blocks: usize,
) {
    let ch = inplace_edge::client::channel(socket).await.unwrap();
    let mut c = NodeAgentClient::new(ch.clone());
    let mut h = HealthClient::new(ch);
    let spec =
        inplace_wire::yaml::parse(&std::fs::read_to_string(example("specs/full.yaml")).unwrap())
            .unwrap();
    let r = coverage(&mut c, &spec).await;
    note(format!(
        "full.yaml: {} change(s), fully covered {}",
        r.changes.len(),
        r.fully_covered
    ));
    for _ in 0..BLOCK {
        timed_coverage(&mut c, &spec).await;
        timed_health(&mut h).await;
    }
    let (mut tc, mut te) = (Vec::new(), Vec::new());
    let (mut cpu_c, mut cpu_e) = (0.0, 0.0);
    for _ in 0..blocks {
        let s0 = sched(pid);
        for _ in 0..BLOCK {
            te.push(timed_health(&mut h).await);
        }
        let s1 = sched(pid);
        for _ in 0..BLOCK {
            tc.push(timed_coverage(&mut c, &spec).await);
        }
        let s2 = sched(pid);
        cpu_e += sched_delta(&s0, &s1).0;
        cpu_c += sched_delta(&s1, &s2).0;
    }
    let n = (blocks * BLOCK) as f64;
    let (cpu_c, cpu_e) = (cpu_c * 1e3 / n, cpu_e * 1e3 / n);
    rep.fig(&format!("coverage_{what}_p50"), us(pct(&tc, 50.0)), "us");
    rep.fig(&format!("coverage_{what}_p99"), us(pct(&tc, 99.0)), "us");
    rep.fig(&format!("coverage_{what}_daemon_cpu_per_call"), cpu_c, "us");
    rep.floor(
        &format!("floor_{what}_empty_call_p50"),
        us(pct(&te, 50.0)),
        "us",
    );
    rep.floor(
        &format!("floor_{what}_empty_call_p99"),
        us(pct(&te, 99.0)),
        "us",
    );
    rep.floor(&format!("floor_{what}_empty_call_daemon_cpu"), cpu_e, "us");
    rep.ratio(
        &format!("ratio_coverage_{what}_p50_vs_empty"),
        us(pct(&tc, 50.0)),
        us(pct(&te, 50.0)),
    );
    rep.ratio(
        &format!("ratio_coverage_{what}_p99_vs_empty"),
        us(pct(&tc, 99.0)),
        us(pct(&te, 99.0)),
    );
    rep.ratio(
        &format!("ratio_coverage_{what}_daemon_cpu_vs_empty"),
        cpu_c,
        cpu_e,
    );
}

/// `BENCH_ONLY=coverage`: a fresh daemon on a copy of `examples/node`, then
/// [`coverage_full`] with [`BLOCKS`] pairs of blocks (4 quick, or `BENCH_COVERAGE_BLOCKS`);
/// then the same with a daemon that keeps no answer.
pub(crate) async fn only(rep: &mut Report, quick: bool) {
    let blocks = env_knob("BENCH_COVERAGE_BLOCKS").unwrap_or(if quick { 4 } else { BLOCKS });
    for (what, keep) in [("full", "1"), ("full_computed", "0")] {
        let mut d = Daemon::new("covfull");
        d.env.push(("INPLACED_KEEP_COVERAGE".into(), keep.into()));
        d.start().await;
        coverage_full(rep, what, &d.socket.clone(), d.pid(), blocks).await;
        d.stop().await;
    }
}
