//! `inplace-extension`: thin main; see `inplaced::cli::extension`.
fn main() -> std::process::ExitCode {
    inplaced::cli::extension::main()
}
