//! `inplaced`: see [`inplaced::cli::daemon`].
fn main() -> std::process::ExitCode {
    inplaced::cli::daemon::main()
}
