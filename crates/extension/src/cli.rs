//! `inplace-extension`: the CAPI Runtime Extension serving the in-place update hooks.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;

use crate::config::Config;
use crate::extension::Extension;
use crate::http::{Endpoint, allowlist, serve, serve_metrics, tls_config};
use inplace_edge::tls::{Acceptor, Reloading};

/// Cluster API Runtime Extension for in-place updates, backed by inplaced node agents.
#[derive(Debug, Parser)]
#[command(
    name = "inplace-extension",
    version,
    about = "Cluster API Runtime Extension that answers the in-place update hooks from node coverage"
)]
pub struct Args {
    /// Configuration (TOML): server certificate, agent client identity, resolver, policy.
    #[arg(
        long,
        default_value = "/etc/inplace-extension/config.toml",
        env = "INPLACE_EXTENSION_CONFIG"
    )]
    pub config: PathBuf,
    /// Log filter: a level and comma-separated target=level directives, e.g. "info" or
    /// "inplaced=debug,h2=off".
    #[arg(long, default_value = "info", env = "INPLACE_EXTENSION_LOG")]
    pub log: String,
}

/// Runs the extension until SIGTERM or SIGINT.
pub fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(e) = inplace_edge::logging::init(&args.log) {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    inplace_edge::process::exit(run(args))
}

/// Most runtime worker threads. A hook costs the extension 0.3–0.9 ms of CPU (at N =
/// 1000, BENCHMARKS.md), so 4 workers answer thousands of hooks a second; one per core on
/// a large management-cluster node only adds threads (and, before `M_ARENA_MAX`, malloc
/// arenas): at N = 1000 with 16 workers the RSS after the hooks was 48 MiB against 43 MiB
/// with 2, peak 116 against 109 MiB.
const WORKERS: usize = 4;

fn run(args: Args) -> anyhow::Result<()> {
    let config = Config::load(&args.config)?;
    let client_ca = config.server.client_ca.clone().unwrap_or_default();
    let endpoint = Endpoint {
        acceptor: Arc::new(Acceptor::with_builder(
            vec![
                config.server.cert.clone(),
                config.server.key.clone(),
                client_ca,
            ],
            tls_config,
        )?),
        clients: Arc::new(Reloading::watch(
            "server.clients",
            vec![args.config.clone()],
            allowlist,
        )?),
    };
    let listen = config.server.listen.clone();
    // Descriptors: one pooled connection per agent (up to pool::MAX_CHANNELS) and one per hook in
    // flight (`server.max_connections`, pending handshakes): a soft limit of 1024 (the
    // default of systemd and many container runtimes) runs out at fleet size.
    match inplace_edge::accept::raise_nofile_limit() {
        Ok((soft, hard)) => tracing::debug!(soft, hard, "RLIMIT_NOFILE"),
        Err(e) => tracing::warn!(error = %e, "could not raise RLIMIT_NOFILE"),
    }
    // before any thread: 2 malloc arenas, not 8 per core (crate::memory)
    if !crate::memory::configure() {
        tracing::debug!("M_ARENA_MAX not set (not glibc)");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(
            WORKERS
                .min(std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)),
        )
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&listen)
            .await
            .with_context(|| format!("server.listen {listen}"))?;
        tracing::info!(listen = %listener.local_addr()?, "inplace-extension serving the CAPI in-place update hooks");
        if !config.metrics.listen.is_empty() {
            let l = tokio::net::TcpListener::bind(&config.metrics.listen)
                .await
                .with_context(|| format!("metrics.listen {}", config.metrics.listen))?;
            tracing::info!(listen = %l.local_addr()?, "serving metrics");
            tokio::spawn(serve_metrics(l));
        }
        let ext = Arc::new(Extension::new(config));
        serve(ext, listener, endpoint, inplace_edge::process::stop_requested()).await;
        tracing::info!("stopped");
        Ok(())
    })
}
