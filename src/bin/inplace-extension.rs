//! `inplace-extension`: thin main; see `inplace_extension::cli`.
fn main() -> std::process::ExitCode {
    inplace_extension::cli::main()
}
