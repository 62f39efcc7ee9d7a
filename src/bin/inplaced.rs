//! `inplaced`: see [`inplace_agent::cli::daemon`].

/// jemalloc, with the settings of [`inplace_agent::allocator`] (which says why).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The settings jemalloc reads at its first allocation, under the name it looks up.
// SAFETY: jemalloc declares `_rjem_malloc_conf` as a weak `const char *`; this is one,
// to a NUL-terminated string that lives as long as the process.
#[allow(unsafe_code)]
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: inplace_agent::allocator::MallocConf = inplace_agent::allocator::MALLOC_CONF;

fn main() -> std::process::ExitCode {
    inplace_agent::cli::daemon::main()
}
