//! `inplacectl`: see [`inplaced::cli::ctl`].
fn main() -> std::process::ExitCode {
    inplaced::cli::ctl::main()
}
