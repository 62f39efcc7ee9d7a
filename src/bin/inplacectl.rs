//! `inplacectl`: see [`inplace_agent::cli::ctl`].
fn main() -> std::process::ExitCode {
    inplace_agent::cli::ctl::main()
}
