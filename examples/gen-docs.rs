//! Generates the man pages (`clap_mangen`) and shell completions (`clap_complete`) of the
//! three binaries from their clap definitions, so they never disagree with `--help`:
//!
//! - `<dir>/man/inplaced.8.gz`, `inplacectl.1.gz`, `inplace-extension.8.gz` and one page
//!   per subcommand (`inplacectl-apply.1.gz`, `inplacectl-validate.1.gz`, ...; gzip, as
//!   Debian policy and RPM's brp-compress ship them);
//! - `<dir>/completions/inplacectl.bash`, `inplaced.bash`, `_inplacectl` (zsh),
//!   `inplacectl.fish`;
//! - `<dir>/nodespec.schema.json`: the NodeSpec's JSON Schema
//!   ([`inplace_wire::yaml::json_schema`]).
//!
//! `packaging/check.sh` runs it after the release build (into `target/assets`, where the
//! package metadata in `Cargo.toml` picks the files up).
//! Usage: `cargo run --example gen-docs -- <dir>`.

use std::io::Write;

use clap::CommandFactory;
use clap_complete::Shell;

fn gzip(bytes: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(bytes)?;
    e.finish()
}

fn main() -> std::io::Result<()> {
    let dir = std::path::PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "target/assets".into()),
    );
    let man = dir.join("man");
    let comp = dir.join("completions");
    std::fs::create_dir_all(&man)?;
    std::fs::create_dir_all(&comp)?;
    let pages = [
        (inplace_agent::cli::daemon::Args::command(), "inplaced", "8"),
        (inplace_agent::cli::ctl::Args::command(), "inplacectl", "1"),
        (
            inplace_extension::cli::Args::command(),
            "inplace-extension",
            "8",
        ),
    ];
    for (cmd, name, section) in pages {
        let mut cmd = cmd.name(name);
        // the global options reach the subcommands' pages too
        cmd.build();
        let mut page = Vec::new();
        clap_mangen::Man::new(cmd.clone())
            .section(section)
            .render(&mut page)?;
        std::fs::write(man.join(format!("{name}.{section}.gz")), gzip(&page)?)?;
        // one page per subcommand, `<name>-<sub>.<section>`: the main page's SUBCOMMANDS
        // section names them so (clap_mangen)
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            // clap takes a &'static str name (no `string` feature); the program ends soon
            let full: &'static str = format!("{name}-{}", sub.get_name()).leak();
            let mut page = Vec::new();
            clap_mangen::Man::new(
                sub.clone()
                    .name(full)
                    .bin_name(format!("{name} {}", sub.get_name())),
            )
            .section(section)
            .render(&mut page)?;
            std::fs::write(man.join(format!("{full}.{section}.gz")), gzip(&page)?)?;
        }
    }
    let mut ctl = inplace_agent::cli::ctl::Args::command().name("inplacectl");
    let mut daemon = inplace_agent::cli::daemon::Args::command().name("inplaced");
    let write = |file: &str, shell: Shell, cmd: &mut clap::Command, bin: &str| {
        let mut out = Vec::new();
        clap_complete::generate(shell, cmd, bin, &mut out);
        std::fs::write(comp.join(file), out)
    };
    write("inplacectl.bash", Shell::Bash, &mut ctl, "inplacectl")?;
    write("_inplacectl", Shell::Zsh, &mut ctl, "inplacectl")?;
    write("inplacectl.fish", Shell::Fish, &mut ctl, "inplacectl")?;
    write("inplaced.bash", Shell::Bash, &mut daemon, "inplaced")?;
    // the NodeSpec's JSON Schema (docs/nodespec.schema.json is the same text; a test in
    // tests/cli_validate.rs keeps them equal)
    let schema = serde_json::to_string_pretty(&inplace_wire::yaml::json_schema())?;
    std::fs::write(dir.join("nodespec.schema.json"), format!("{schema}\n"))?;
    println!(
        "wrote man pages, completions and nodespec.schema.json to {}",
        dir.display()
    );
    Ok(())
}
