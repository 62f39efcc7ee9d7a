//! `inplaced`: see [`inplace_agent::cli::daemon`].
fn main() -> std::process::ExitCode {
    inplace_agent::cli::daemon::main()
}
